"""The command line's conventions (issue 23): --version, completion, an example per command,
one duration syntax, --json on writes, logging flags, refused unknown configuration, and the
status and relay defects found in a new user's first hour."""

from __future__ import annotations

import asyncio
import inspect
import json
import shlex
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import typer
from outboxkit.cli.examples import EXAMPLES
from outboxkit.cli.main import build_app
from outboxkit.cli.options import Duration, parse_duration_ms
from outboxkit.outbox import new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.tables import outbox_events
from sqlalchemy import func, select, update

from tests.relay.test_relay import write_events
from tests.support.ops import cli, cli_process

DURATION_WORDS = ("interval", "timeout", "ttl", "age", "after", "retention", "older")
NOT_DURATIONS = {"--request-timeout-ms", "--max-slot-lag-bytes"}  # ms int (deprecated); bytes


def _root() -> Any:
    return typer.main.get_command(build_app())


def _commands() -> dict[str, Any]:
    """Every leaf command by its path (``outbox requeue``)."""
    found: dict[str, Any] = {}
    pending = [("", _root())]
    while pending:
        prefix, command = pending.pop()
        subs = getattr(command, "commands", None)
        if subs:
            pending += [(f"{prefix}{name} ", sub) for name, sub in subs.items()]
        else:
            found[prefix.strip()] = command
    return found


async def test_version_is_the_package_metadata() -> None:
    done = await cli("--version")
    assert done.code == 0, done.err and done.out.strip() == f"outboxkit {version('outboxkit')}"


async def test_shell_completion_is_on() -> None:
    done = await cli("--help")
    assert "--install-completion" in done.out and "--show-completion" in done.out


async def test_every_command_shows_an_example_that_parses() -> None:
    commands = _commands()
    assert set(commands) == set(EXAMPLES), set(commands) ^ set(EXAMPLES)
    root = _root()
    for path, example in EXAMPLES.items():
        words = shlex.split(example)
        assert words[0] == "outboxkit" and " ".join(words[1:]).startswith(path), example
        # The real parser: options and arguments must be what the command takes.
        root.make_context("outboxkit", words[1:], resilient_parsing=False)
        assert "Example:" in (await cli(*path.split(), "--help")).out, path


def _typer_options() -> list[tuple[str, list[str], Any]]:
    """(command path, option names, parser) of every option, from typer's declarations."""
    found: list[tuple[str, list[str], Any]] = []
    pending = [("", build_app())]
    while pending:
        prefix, app = pending.pop()
        for command in app.registered_commands:
            assert command.callback is not None
            name = command.name or command.callback.__name__
            for parameter in inspect.signature(command.callback).parameters.values():
                info = parameter.default
                if isinstance(info, typer.models.OptionInfo):
                    names = [d for d in info.param_decls or () if d.startswith("--")]
                    names = names or [f"--{parameter.name.replace('_', '-')}"]
                    found.append((f"{prefix}{name}", names, info.parser))
        pending += [(f"{prefix}{g.name} ", g.typer_instance) for g in app.registered_groups]
    return found


def test_every_duration_flag_takes_the_one_syntax() -> None:
    checked = 0
    for path, names, parser in _typer_options():
        is_duration = isinstance(parser, Duration)
        if any(w in n for n in names for w in DURATION_WORDS) and not set(names) & NOT_DURATIONS:
            assert is_duration, (path, names)
        if is_duration:
            checked += 1
            for given, seconds in (("5s", 5.0), ("5", 5.0), ("2m", 120.0), ("1h", 3600.0)):
                assert parser(given) == seconds, (path, names)
            if (parser.minimum_s or 0) <= 0.5:
                assert parser("500ms") == 0.5
    assert checked >= 12, checked


@pytest.mark.parametrize(
    ("text", "ms"),
    [("500ms", 500), ("5s", 5000), ("2m", 120_000), ("1h", 3_600_000), ("5", 5000), ("0.5", 500)],
)
def test_the_duration_parser(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


async def test_a_bad_duration_is_one_line_and_exit_2(sqlite_url: str) -> None:
    for argv in (
        ["relay", "--poll-interval", "soon", "--db-url", sqlite_url],
        ["workflows", "run", "x:y", "--poll-interval", "1 minute"],
        ["status", "--max-oldest-age", "-5", "--db-url", sqlite_url],
    ):
        done = await cli(*argv)
        assert done.code == 2, argv
        assert len(done.err.strip().splitlines()) == 1 and "duration" in done.err, done.err


def test_relay_and_workflows_take_both_spellings() -> None:
    """Before, ``relay --poll-interval 1s`` and ``workflows run --poll-interval 1`` were refused."""
    root = _root()
    for argv in (
        ["relay", "--poll-interval", "1s"],
        ["workflows", "run", "m:e", "--poll-interval", "1"],
    ):
        ctx = root.make_context("outboxkit", list(argv))
        sub = root.get_command(ctx, argv[0])
        if argv[0] == "workflows":
            sub = sub.get_command(ctx, "run")
            params = sub.make_context("run", argv[2:]).params
        else:
            params = sub.make_context("relay", argv[1:]).params
        assert params["poll_interval"] == 1.0, argv


async def test_requeue_sweep_and_cleanup_report_in_json(sqlite_url: str, topic: str) -> None:
    write_events(sqlite_url, topic, [new_event("a", "/s", {"n": i}) for i in range(3)])
    engine = make_engine(sqlite_url)
    with engine.begin() as connection:
        connection.execute(update(outbox_events).values(parked_ms=1, attempts=10))
    requeued = await cli("outbox", "requeue", "--all-parked", "--json", "--db-url", sqlite_url)
    assert requeued.code == 0 and requeued.json() == {"requeued": 3, "ids": "all-parked"}
    with engine.connect() as connection:
        parked = connection.scalar(
            select(func.count()).where(outbox_events.c.parked_ms.is_not(None))
        )
    engine.dispose()
    assert parked == 0
    swept = await cli("actions", "sweep", "--json", "--db-url", sqlite_url)
    assert swept.json() == {"marked_unknown": 0, "operations": []}
    for argv in (["actions", "cleanup"], ["idempotency", "purge"]):
        done = await cli(*argv, "--json", "--db-url", sqlite_url)
        assert done.code == 0 and done.json() == {"deleted": 0}, argv
    migrated = await cli("migrate", "--json", "--db-url", sqlite_url)
    assert migrated.json() == {"migrated": True}


async def test_relay_logs_in_json_at_the_level_asked(
    sqlite_url: str, kafka_bootstrap: str, topic: str
) -> None:
    """--log-level and --json-logs, as docs/observability.md says, on a real drain."""
    broker = ("--bootstrap", kafka_bootstrap)
    done = await asyncio.to_thread(
        cli_process,
        *("relay", "--db-url", sqlite_url, "--drain", "--json-logs", "--log-level", "WARNING"),
        *broker,
        timeout=300,
    )
    assert done.code == 0, done.err
    assert done.err.strip() == ""  # nothing pending, nothing at WARNING
    done = await asyncio.to_thread(
        cli_process, "relay", "--db-url", sqlite_url, "--drain", "--json-logs", *broker, timeout=300
    )
    lines = [json.loads(line) for line in done.err.strip().splitlines()]
    assert lines and all(line["level"] == "INFO" for line in lines), done.err


def test_consume_takes_json_logs() -> None:
    root = _root()
    ctx = root.make_context(
        "outboxkit", ["consume", "m:app", "--json-logs", "--log-level", "debug"]
    )
    assert ctx is not None


async def test_relay_on_an_unmigrated_database_is_only_the_one_line(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE host_table (x INTEGER)")
    engine.dispose()
    for extra in ((), ("--drain",)):
        done = await asyncio.to_thread(
            cli_process, "relay", "--db-url", f"sqlite:///{path}", *extra, timeout=300
        )
        assert done.code == 2
        assert done.err.splitlines() == [
            "outboxkit: error: table outbox_events is missing: run 'outboxkit migrate' first"
        ], done.err


async def test_an_unknown_table_in_the_config_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "outboxkit.toml"
    config.write_text('[databse]\nurl = "sqlite:///elsewhere.db"\n')
    done = await cli("--config", str(config), "migrate")
    assert done.code == 2 and not (Path.cwd() / "elsewhere.db").exists()
    assert done.err.splitlines() == [
        f"outboxkit: error: config file {config}: unknown table(s) [databse]: the tables are "
        "[database], [kafka]"
    ]


async def test_an_unknown_outboxkit_variable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SSL_PASSWORD", "secret")
    done = await cli("status", "--help")
    assert done.code == 2
    assert done.err.splitlines() == [
        "outboxkit: error: environment variable OUTBOXKIT_KAFKA_SSL_PASSWORD is not a setting "
        "(did you mean OUTBOXKIT_KAFKA_SASL_PASSWORD or OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD?)"
    ]
    assert "secret" not in done.err


async def test_known_variables_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOXKIT_WORKFLOW_APP", "m:e")  # read by the CLI's own option
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD", "x")
    assert (await cli("--version")).code == 0


async def test_status_names_an_unreachable_database_once(kafka_bootstrap: str) -> None:
    """docs/operations.md: each unreachable source once; lag unread for want of the database's
    group names is not a second source. A long cause stays on one line when piped."""
    down = "postgresql://nobody:pw@127.0.0.1:1/" + "x" * 250
    done = await cli("status", "--db-url", down, "--bootstrap", kafka_bootstrap, "--timeout", "5")
    assert done.code == 3
    unreachable = [line for line in done.err.splitlines() if "unreachable:" in line]
    assert len(unreachable) == 1 and "127.0.0.1:1" in unreachable[0], done.err
    lines = done.out.splitlines()
    heads = [line.split(":")[0] for line in lines[:5]]
    assert heads == ["outbox", "relays", "actions", "inbox", "consumer lag"], done.out
    assert "x" * 200 in lines[0], done.out
