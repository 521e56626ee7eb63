#!/usr/bin/env bash
# CI lanes beside the main suite, each in a virtualenv of its own under build/lanes/:
#   lowest  the lowest versions pyproject.toml allows (uv --resolution lowest-direct): the fast
#           lane plus a PostgreSQL consumer smoke test (a batch through the inbox claim);
#   py3.11, py3.12, py3.13  the fast lane on each declared Python (pyenv's, or python3.X on PATH).
# The lanes run side by side; each lane's log and time are printed when all have ended.
# Runs after scripts/test.sh, which made .venv (with uv) and started PostgreSQL. `bash scripts/ci-lanes.sh lowest py3.13` runs only those lanes.
set -euo pipefail
cd "$(dirname "$0")/.."
STOCK_PYTHON=$(command -v python3) # the lowest lane's interpreter: the one on PATH, not .venv's
source scripts/venv.sh >/dev/null
UV="$VENV/bin/uv" # from the test extras
LANES=("$@")
# py3.11 is the main suite itself (scripts/test.sh runs on Debian's python3 3.11): not run twice.
[ ${#LANES[@]} -gt 0 ] || LANES=(lowest py3.12 py3.13)
OUTBOXKIT_TEST_PG_URL="${OUTBOXKIT_TEST_PG_URL:-$(bash scripts/start-postgres.sh)}"
export OUTBOXKIT_TEST_PG_URL
FAST=(-m "not integration" -q -p no:cacheprovider)
# A real consumer batch on PostgreSQL through the inbox claim (unnest of two arrays), and the
# claim itself: SQLAlchemy 2.0.0-2.0.9 fail it (`unnest(unknown) is not unique`).
SMOKE=(-q -p no:cacheprovider
  "tests/consumers/test_batch.py::test_a_batch_handler_applies_each_event_once_in_order_with_few_calls"
  "tests/consumers/test_inbox.py::test_claim_many_returns_exactly_the_keys_no_claim_had_before[postgresql]")

find_python() { # the newest python of minor version $1: pyenv's, else on PATH
  local found
  found=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python"$1" 2>/dev/null | sort -V | tail -n 1)
  [ -n "$found" ] || found=$(command -v "python$1" 2>/dev/null || true)
  [ -n "$found" ] || { echo "ci-lanes: no Python $1 found (PATH or pyenv)" >&2; exit 2; }
  echo "$found"
}

make_lane_venv() { # $1 lane name, $2 python, $3... uv pip install options
  local dir="build/lanes/$1" python="$2"
  shift 2
  rm -rf "$dir"
  "$UV" venv -q --seed --python "$python" "$dir" # --seed: pip, which tests/test_packaging.py uses
  "$UV" pip install -q --python "$dir/bin/python" "$@" -e ".[test]"
  echo "$dir/bin/python"
}

run_lane() { # $1 lane: makes its virtualenv, then runs its tests
  local lane="$1" lane_py
  case "$lane" in
    lowest)
      lane_py=$(make_lane_venv lowest "$STOCK_PYTHON" --resolution lowest-direct)
      "$UV" pip list --python "$lane_py" | grep -iE '^(sqlalchemy|typer|alembic|pydantic|aiokafka|asyncpg|psycopg) '
      "$lane_py" -m pytest "${FAST[@]}"
      "$lane_py" -m pytest "${SMOKE[@]}"
      ;;
    py3.*)
      lane_py=$(make_lane_venv "$lane" "$(find_python "${lane#py}")")
      "$lane_py" -V
      "$lane_py" -m pytest "${FAST[@]}"
      ;;
    *) echo "ci-lanes: unknown lane $lane" >&2; return 2 ;;
  esac
}

# The lanes run side by side (each test makes its own files, databases and ports), each into a
# log of its own, printed whole when all have ended: about the time of the slowest lane on two
# CPUs instead of the sum of all three.
mkdir -p build/lanes
declare -A PIDS STARTED
for lane in "${LANES[@]}"; do
  STARTED[$lane]=$SECONDS
  (set -e; run_lane "$lane") > "build/lanes/$lane.log" 2>&1 &
  PIDS[$lane]=$!
done
SUMMARY=()
FAILED=()
for lane in "${LANES[@]}"; do
  if wait "${PIDS[$lane]}"; then status=passed; else status=FAILED; FAILED+=("$lane"); fi
  echo "== lane $lane ($status)"
  cat "build/lanes/$lane.log"
  SUMMARY+=("$lane: $((SECONDS - STARTED[$lane])) s $status")
done
echo "== lane times (side by side): ${SUMMARY[*]}"
[ ${#FAILED[@]} -eq 0 ] || { echo "ci-lanes: failed: ${FAILED[*]}" >&2; exit 1; }
