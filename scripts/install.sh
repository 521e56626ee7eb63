#!/usr/bin/env bash
# Installs outboxkit with its test extras and fetches the Apache Kafka broker jars (once).
set -euo pipefail
cd "$(dirname "$0")/.."
# javac too: tests/interop compiles a small program against the CloudEvents Java SDK.
if ! command -v javac >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
fi
# systemd-analyze: tests/docs checks the systemd units of docs/deploy.md with `verify`.
command -v systemd-analyze >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null; }
python3 -m pip install -q --disable-pip-version-check -e ".[test]"
python3 -c "from outboxkit.testing.kafka import fetch_jars; print('kafka jars:', fetch_jars())"
