#!/usr/bin/env bash
# Installs outboxkit into the project virtualenv (.venv, made by scripts/venv.sh) and fetches the
# Apache Kafka broker jars (once). `bash scripts/install.sh` installs the test extras (what the
# suite needs); `bash scripts/install.sh base` only what the quick start needs (SQLite).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-test}"
source scripts/venv.sh
# A JDK and Maven: the broker runs on Java 17, mvn fetches its jars; javac too: tests/interop
# compiles a small program against the CloudEvents Java SDK.
if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1 \
  || { [ "$EXTRAS" != base ] && ! command -v javac >/dev/null 2>&1; }; then
  echo "installing openjdk-17-jdk-headless and maven (apt)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
fi
# The console's browser tests (tests/console/test_browser.py): Debian's headless Chromium.
if [ "$EXTRAS" != base ] && ! command -v chromium >/dev/null 2>&1; then
  echo "installing chromium and chromium-driver (apt)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
# systemd-analyze: tests/docs checks the systemd units of docs/deploy.md with `verify`.
if [ "$EXTRAS" != base ] && ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "installing systemd (apt, for systemd-analyze)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
fi
# PgBouncer in transaction mode: the pooler tests (outboxkit.testing.pgbouncer) start Debian's.
if [ "$EXTRAS" != base ] && ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
  echo "installing pgbouncer (apt)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null
fi
# PostgreSQL high availability (outboxkit.testing.patroni, tests/ha): Debian's Patroni (run by
# Debian's python3, with python3-etcd and python3-psycopg2), etcd and HAProxy.
if [ "$EXTRAS" != base ] && { ! command -v patroni >/dev/null 2>&1 \
  || ! command -v etcd >/dev/null 2>&1 || ! command -v haproxy >/dev/null 2>&1; }; then
  echo "installing patroni, etcd-server and haproxy (apt)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patroni etcd-server haproxy >/dev/null
fi
if [ "$EXTRAS" = base ]; then
  TARGET="."
else
  TARGET=".[$EXTRAS]"
fi
echo "installing outboxkit ($TARGET) into $VENV"
# A line a step and a package (pip's "Collecting"), errors on stderr; pipefail keeps pip's code.
PYTHONUNBUFFERED=1 "$PY" -m pip install --disable-pip-version-check --progress-bar off -e "$TARGET" \
  | { grep -E --line-buffered '^ *(Obtaining|Installing|Building|Collecting|Successfully installed)' | sed -u 's/^/  /' || true; }
"$PY" -c "from outboxkit.testing.kafka import fetch_jars; print('kafka jars:', fetch_jars(quiet=False))"
