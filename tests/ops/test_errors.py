"""Bad input to the operator commands: one clear line on stderr and exit code 2, never a
traceback, also when the broker or the database is unreachable or does not answer."""

from __future__ import annotations

from pathlib import Path

from outboxkit.testing.kafka import create_topic

from tests.support.consumers import produce
from tests.support.ops import cli, cli_process


async def test_bad_filters_topics_and_offsets_are_one_line_and_exit_2(
    sqlite_url: str, kafka_bootstrap: str, topic: str
) -> None:
    dlq = f"{topic}.dlq"
    await create_topic(kafka_bootstrap, dlq)
    await produce(kafka_bootstrap, dlq, [(None, b"x", []) for _ in range(3)])
    kafka = ("--bootstrap", kafka_bootstrap)
    cases = [
        (["dlq", "list", f"{topic}.nope", *kafka], f"topic '{topic}.nope' does not exist"),
        (["dlq", "show", f"{topic}.nope", "0", *kafka], "does not exist"),
        (["dlq", "list", dlq, "--since", "yesterday", *kafka], "--since: cannot read 'yesterday'"),
        (["dlq", "list", dlq, "--until", "2026-13-45", *kafka], "--until: cannot read"),
        (["dlq", "list", dlq, "--since", "1h", "--until", "2h", *kafka], "--since is later"),
        (
            ["dlq", "list", dlq, "--from-offset", "5", "--to-offset", "2", *kafka],
            "--from-offset 5 is after --to-offset 2",
        ),
        (
            ["dlq", "list", dlq, "--from-offset", "50", *kafka],
            f"offsets 50-end are out of range: {dlq}[0] holds offsets 0-2",
        ),
        (["dlq", "list", dlq, "--error-class", "fatal:Boom", *kafka], "--error-class 'fatal:Boom'"),
        (["dlq", "list", dlq, "--partition", "3", *kafka], f"partition 3 does not exist in {dlq}"),
        (["dlq", "list", dlq, "--from-offset", "-1", *kafka], "--from-offset"),
        (["dlq", "list", dlq, "--colour", *kafka], "No such option: --colour"),
        (
            ["dlq", "show", dlq, "3", *kafka],
            f"offset 3 is out of range: {dlq}[0] holds offsets 0-2",
        ),
        (["dlq", "show", dlq, "0", "--partition", "1", *kafka], "partition 1 does not exist"),
        (
            ["dlq", "replay", dlq, "--to", f"{topic}.nope", "--db-url", sqlite_url, *kafka],
            f"target topic '{topic}.nope' does not exist",
        ),
        (["dlq", "replay", dlq, "--rate", "0", "--db-url", sqlite_url, *kafka], "--rate"),
        (["status", "--max-dlq", "many", "--db-url", sqlite_url, *kafka], "--max-dlq"),
        (["status", "5", "--db-url", sqlite_url, *kafka], "refresh interval of --watch"),
        (["status", "--watch", "--json", "--db-url", sqlite_url, *kafka], "use --json without"),
        (["status", "--watch", "0", "--db-url", sqlite_url, *kafka], "INTERVAL"),
        (["status", "--db-url", "nonsense://", *kafka], "database URL"),
        (["outbox", "requeue", "12", "--db-url", sqlite_url], "no outbox row with id 12"),
    ]
    for argv, expected in cases:
        result = await cli(*argv)
        assert result.code == 2, (argv, result.out, result.err)
        assert expected in result.error_line(), argv
    # Nothing was created by asking about a topic that does not exist (auto-creation is on).
    again = await cli("dlq", "list", f"{topic}.nope", *kafka)
    assert "does not exist" in again.error_line()


async def test_unreachable_or_silent_broker_and_database_are_bounded(
    pg_url: str, kafka_bootstrap: str, mute_server: str, tmp_path: Path
) -> None:
    refused = await cli("dlq", "list", "orders.dlq", "--bootstrap", "127.0.0.1:1")
    assert refused.code == 2
    assert "kafka at 127.0.0.1:1 unreachable" in refused.error_line()

    silent = await cli("dlq", "list", "orders.dlq", "--bootstrap", mute_server, "--timeout", "1")
    assert silent.code == 2
    assert f"kafka at {mute_server} did not answer within 1 s" in silent.error_line()
    assert silent.seconds < 8

    # status reports an unreachable source in its sections (exit 3): tests/ops/test_status.py
    status = await cli("status", "--db-url", pg_url, "--bootstrap", mute_server, "--timeout", "1")
    assert status.code == 3 and "did not answer within 1 s" in status.err
    assert status.seconds < 8

    host, port = mute_server.split(":")
    hung_db = f"postgresql://postgres:postgres@{host}:{port}/outbox"
    no_db = await cli("outbox", "list", "--db-url", hung_db, "--timeout", "1")
    assert no_db.code == 2 and "did not answer within 1 s" in no_db.error_line()
    assert no_db.seconds < 8

    down_db = "postgresql://postgres:postgres@127.0.0.1:1/outbox"
    for argv in (
        ["outbox", "list", "--parked", "--db-url", down_db],
        ["outbox", "requeue", "--all-parked", "--db-url", down_db],
        ["dlq", "replay", "orders.dlq", "--db-url", down_db, "--bootstrap", kafka_bootstrap],
    ):
        result = await cli(*argv)
        assert result.code == 2, argv
        assert "unreachable" in result.error_line(), argv

    missing_file = await cli("outbox", "list", "--db-url", f"sqlite:///{tmp_path / 'none.db'}")
    assert "does not exist" in missing_file.error_line()
    (tmp_path / "empty.db").touch()
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    unmigrated = await cli("outbox", "list", "--db-url", empty)
    assert "run 'outboxkit migrate' first" in unmigrated.error_line()
    # status cannot read a database that is not migrated: its sections say why, exit 3.
    status = await cli("status", "--db-url", empty, "--bootstrap", kafka_bootstrap)
    assert status.code == 3
    assert "outbox: unreachable: table outbox_events is missing: run 'outboxkit migrate'" in (
        status.out
    )


def test_as_a_process_an_unreachable_broker_or_database_prints_exactly_one_line(
    mute_server: str,
) -> None:
    broker = cli_process("dlq", "list", "orders.dlq", "--bootstrap", mute_server, "--timeout", "1")
    assert broker.code == 2 and broker.out == ""
    assert f"kafka at {mute_server} did not answer" in broker.error_line()
    database = cli_process(
        "outbox", "list", "--parked", "--db-url", "postgresql://postgres:postgres@127.0.0.1:1/x"
    )
    assert database.code == 2 and database.out == ""
    assert "unreachable" in database.error_line()
