"""One table of exit codes for every command (docs/operations.md#exit-codes): each code is
produced here by a real run, except 3 (``status`` with a source unreachable), which
tests/ops/test_status.py and tests/ops/test_errors.py cover."""

from __future__ import annotations

import asyncio
import contextlib
import io
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from outboxkit.cli.errors import (
    EXIT_BUG,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_THRESHOLD,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
)
from outboxkit.cli.main import run_app
from outboxkit.outbox import new_event

from tests.cli.test_signals import caught_signals, spawn_cli, wait_until_held
from tests.relay.test_relay import write_events
from tests.support.ops import cli, cli_process
from tests.support.waits import scaled

BAD_URLS = {
    "not a url": "invalid database URL: expected e.g. postgresql://",
    "mysql://app:s3cret@db/shop": "unsupported database URL mysql://app:***@db/shop",
}
# Every command that takes --db-url; none may reach a broker (127.0.0.1:1 refuses).
DB_COMMANDS = [
    ["migrate"],
    ["relay", "--bootstrap", "127.0.0.1:1"],
    ["relay", "--drain", "--bootstrap", "127.0.0.1:1"],
    ["consume", "tests.support.consumer_apps:effects_app", "--bootstrap", "127.0.0.1:1"],
    ["status", "--bootstrap", "127.0.0.1:1"],
    ["outbox", "list"],
    ["outbox", "requeue", "--all-parked"],
    ["dlq", "replay", "orders.dlq", "--bootstrap", "127.0.0.1:1"],
    ["actions", "list"],
    ["actions", "show", "op-1", "--tenant", "acme"],
    ["actions", "sweep"],
    ["actions", "cleanup"],
]


def test_the_table_is_the_documented_one() -> None:
    codes = (EXIT_OK, EXIT_THRESHOLD, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_BUG, EXIT_INTERRUPTED)
    assert codes == (0, 1, 2, 3, 70, 130)
    table = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    for code in codes:
        assert f"\n| {code} |" in table, code


@pytest.mark.parametrize("argv", DB_COMMANDS, ids=lambda argv: " ".join(argv[:2]))
async def test_a_bad_or_unsupported_database_url_is_one_line_and_exit_2(argv: list[str]) -> None:
    for url, expected in BAD_URLS.items():
        if argv[0] in ("relay", "consume"):  # they handle signals: main thread, so a process
            result = await asyncio.to_thread(cli_process, *argv, "--db-url", url)
        else:
            result = await cli(*argv, "--db-url", url)
        assert result.code == EXIT_USAGE, (argv, url, result.err)
        assert expected in result.error_line(), (argv, url)
        assert "s3cret" not in result.err + result.out


async def test_lease_ttl_below_its_real_minimum_names_that_minimum(
    sqlite_url: str, kafka_bootstrap: str, topic: str
) -> None:
    common = ("--db-url", sqlite_url, "--bootstrap", kafka_bootstrap, "--request-timeout")
    below = await cli("relay", *common, "1500ms", "--lease-ttl", "2.9")
    assert below.code == EXIT_USAGE
    assert "--lease-ttl: 2.9s is below 3s, twice --request-timeout (1.5s)" in (below.error_line())
    default = await cli("relay", "--db-url", sqlite_url, "--lease-ttl", "19s")
    assert "19s is below 20s" in default.error_line()
    # The deprecated --request-timeout-ms (milliseconds) still counts.
    old = await cli(
        "relay", "--db-url", sqlite_url, "--request-timeout-ms", "1500", "--lease-ttl", "2"
    )
    assert "2s is below 3s" in old.error_line()
    # Exactly the minimum is allowed: 0, a command that did its work.
    write_events(sqlite_url, topic, [new_event("a", "/s", {"n": 1})])
    at_minimum = await asyncio.to_thread(
        cli_process, "relay", *common, "1500ms", "--lease-ttl", "3", "--drain"
    )
    assert at_minimum.code == EXIT_OK, at_minimum.err
    assert "1 published" in at_minimum.err


async def test_status_with_a_threshold_crossed_exits_1(
    sqlite_url: str, kafka_bootstrap: str, topic: str
) -> None:
    write_events(sqlite_url, topic, [new_event("a", "/s", {"n": 1})])
    common = ("--db-url", sqlite_url, "--bootstrap", kafka_bootstrap)
    assert (await cli("status", *common)).code == EXIT_OK
    crossed = await cli("status", *common, "--max-oldest-age", "0")
    assert crossed.code == EXIT_THRESHOLD, crossed.err
    assert "threshold crossed" in crossed.err


def run_code(app: typer.Typer, *argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            run_app(app, list(argv))
        except SystemExit as exit_:
            return int(exit_.code or 0), err.getvalue()
    return 0, err.getvalue()


def test_an_unexpected_exception_is_a_traceback_and_exit_70() -> None:
    # A bug cannot be provoked in the shipped commands without planting one, so the runner
    # every command goes through gets a command of the test's own that fails unexpectedly.
    app = typer.Typer()

    @app.command()
    def broken(kind: str) -> None:
        if kind == "bug":
            raise RuntimeError("an invariant broke")
        if kind == "operator":
            raise CliError("fix your input")
        raise KeyboardInterrupt

    @app.command()
    def fine() -> None:
        pass

    code, err = run_code(app, "broken", "bug")
    assert code == EXIT_BUG
    assert "Traceback" in err and "RuntimeError: an invariant broke" in err
    assert run_code(app, "broken", "operator") == (EXIT_USAGE, "outboxkit: error: fix your input\n")
    assert run_code(app, "broken", "interrupt")[0] == EXIT_INTERRUPTED
    assert run_code(app, "fine")[0] == EXIT_OK
    assert run_code(app, "nonsense")[0] == EXIT_USAGE


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A TCP port that accepts connections (the kernel's backlog) and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


def test_ctrl_c_during_a_short_command_exits_130(sqlite_url: str, tmp_path: Path) -> None:
    with silent_server() as silent:
        process = spawn_cli(
            ["status", "--db-url", sqlite_url, "--bootstrap", silent, "--timeout", "60"], tmp_path
        )
        # main() holds both signals while it imports, then gives a short command the default
        # handlers back: SIGINT handled by Python (KeyboardInterrupt), SIGTERM by the kernel.
        wait_until_held(process)
        deadline = time.monotonic() + scaled(30)
        while caught_signals(process.pid) != {signal.SIGINT}:
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        began = time.monotonic()
        assert process.wait(scaled(30)) == EXIT_INTERRUPTED
        assert time.monotonic() - began < 10


def test_migrate_as_a_process_exits_0(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from outboxkit.cli.main import main; main()",
            "migrate",
            "--db-url",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (EXIT_OK, "migrated")
