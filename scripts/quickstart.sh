#!/usr/bin/env bash
# The quick start: installs outboxkit (SQLite only) into .venv, fetches the Kafka jars once, then
# runs the whole pipeline on a SQLite file and a local Apache Kafka broker (examples/quickstart.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh base
source scripts/venv.sh >/dev/null
"$PY" -m examples.quickstart
echo "outboxkit is installed in $VENV: source $VENV/bin/activate (or run $VENV/bin/outboxkit)"
