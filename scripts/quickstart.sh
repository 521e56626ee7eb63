#!/usr/bin/env bash
# The quick start: installs outboxkit, fetches the Kafka jars once, then runs the whole
# pipeline on a SQLite file and a local Apache Kafka broker (examples/quickstart.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh >/dev/null
python3 -m examples.quickstart
