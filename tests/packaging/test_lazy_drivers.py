"""No command imports a PostgreSQL driver it does not use: ``migrate`` and ``status`` on SQLite
load none of asyncpg, psycopg and psycopg2 (psycopg2, for logical mode only, was imported by
every command), and a missing driver is one line naming the extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from outboxkit.outbox.extras import MissingExtraError, require

PROBE = """
import atexit, sys
DRIVERS = ("asyncpg", "psycopg", "psycopg2")
def report():
    print("drivers:", sorted({name.split(".")[0] for name in sys.modules} & set(DRIVERS)))
atexit.register(report)
import outboxkit.outbox, outboxkit.relay, outboxkit.consumers, outboxkit.actions
import outboxkit.workflows, outboxkit.ops, outboxkit.idempotency, outboxkit.migrations
from outboxkit.cli.main import main
sys.argv = ["outboxkit", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("command", [["migrate"], ["outbox", "list"]])
def test_sqlite_commands_import_no_postgresql_driver(tmp_path: Path, command: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    subprocess.run(
        [sys.executable, "-c", PROBE, "migrate", "--db-url", url], check=True, capture_output=True
    )
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *command, "--db-url", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "drivers: []"


def test_a_missing_driver_names_its_extra() -> None:
    with pytest.raises(MissingExtraError) as raised:
        require("outboxkit_no_such_driver", "postgres", "PostgreSQL")
    assert str(raised.value) == (
        "PostgreSQL needs outboxkit_no_such_driver, which is not installed: "
        "pip install 'outboxkit[postgres]'"
    )
