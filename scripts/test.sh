#!/usr/bin/env bash
# The test command: installs what the tests need, starts PostgreSQL, runs lint, mypy and the suite.
# Kafka brokers are started by the test fixtures themselves (real Apache Kafka from Maven jars).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
OUTBOXKIT_TEST_PG_URL="${OUTBOXKIT_TEST_PG_URL:-$(bash scripts/start-postgres.sh)}"
export OUTBOXKIT_TEST_PG_URL
ruff check .
ruff format --check .
python3 scripts/typecheck.py
python3 -m pytest -q -p no:cacheprovider "$@"
