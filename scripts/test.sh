#!/usr/bin/env bash
# The test command: installs what the tests need into .venv, starts PostgreSQL, runs lint, mypy
# and the suite. Kafka brokers are started by the test fixtures themselves (real Apache Kafka
# from Maven jars).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
source scripts/venv.sh >/dev/null
OUTBOXKIT_TEST_PG_URL="${OUTBOXKIT_TEST_PG_URL:-$(bash scripts/start-postgres.sh)}"
export OUTBOXKIT_TEST_PG_URL
"$PY" -m ruff check .
"$PY" -m ruff format --check .
"$PY" scripts/typecheck.py
# The 30 slowest tests are listed at the end: where the run's time goes.
"$PY" -m pytest -q -p no:cacheprovider --durations=30 "$@"
