"""``outboxkit status``: its numbers are what the test set up, thresholds set the exit code, and
a source that cannot be read (the broker, the database, one topic) marks only its own sections:
the others still show their numbers, in text and in ``--json``, and the exit code is 3."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from outboxkit.actions.tables import agent_operations
from outboxkit.consumers.tables import inbox_events
from outboxkit.ops.access import OpsError
from outboxkit.ops.dlq.tables import dlq_replays
from outboxkit.ops.status import cause_line
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay.leases import ShardLeases
from outboxkit.relay.outbox_counts import COUNT_CAP
from outboxkit.testing.kafka import create_topic
from outboxkit.testing.processes import start_cli, terminate
from sqlalchemy import insert, text, update
from sqlalchemy.orm import Session

from tests.support.actions import leave_unknown
from tests.support.consumers import dead_letters_of_two_causes, produce
from tests.support.kafka import wait_for
from tests.support.ops import cli, cli_process, commit_offsets

PARTITION_RECORDS = 5
UNKNOWN_FOR_MS = 300_000  # the UNKNOWN action became UNKNOWN five minutes ago
DEAD_LETTERED_MS_AGO = 600_000  # the oldest dead letter was written ten minutes ago
SECRET = "s3cret-pw"
DOWN_DB = f"postgresql://postgres:{SECRET}@127.0.0.1:1/outbox"
DOWN_BROKER = "127.0.0.1:1"


def set_up_outbox(url: str, topic: str, consumer: str, pending: int = 4) -> None:
    """``pending`` pending rows, the oldest written two minutes ago, and one parked row."""
    engine = make_engine(url)
    with Session(engine) as session, session.begin():
        for n in range(pending + 1):
            Outbox(default_topic=topic).add(session, new_event("a", "/s", {"n": n}, id=f"e-{n}"))
    with engine.begin() as connection:
        connection.execute(
            update(outbox_events)
            .where(outbox_events.c.event_id == "e-0")
            .values(created_ms=outbox_events.c.created_ms - 120_000)
        )
        connection.execute(
            update(outbox_events)
            .where(outbox_events.c.event_id == f"e-{pending}")
            .values(parked_ms=outbox_events.c.created_ms, attempts=10, last_error="too large")
        )
        connection.execute(
            insert(inbox_events),
            [
                {
                    "consumer": consumer,
                    "source": "/s",
                    "event_id": f"i-{n}",
                    "processed_ms": 1,
                }
                for n in range(3)
            ],
        )
        connection.execute(
            insert(dlq_replays).values(
                dlq_topic=f"{topic}.dlq",
                dlq_partition=0,
                dlq_offset=1,
                target_topic=topic,
                replayed_ms=1,
                replayed_by="tester",
                replay_id="r-1",
            )
        )
    engine.dispose()


async def leave_an_unknown_action(url: str) -> None:
    """One action whose call lost its reply: UNKNOWN since ``UNKNOWN_FOR_MS`` ago.

    Its events (requested, started, unknown) are marked published, as a relay would have,
    so the outbox backlog stays what :func:`set_up_outbox` made.
    """
    await leave_unknown(url, "acme", "refund-1")
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(
            update(agent_operations).values(
                updated_ms=agent_operations.c.updated_ms - UNKNOWN_FOR_MS
            )
        )
        connection.execute(
            update(outbox_events)
            .where(outbox_events.c.event_id.not_like("e-%"))
            .values(published_ms=outbox_events.c.created_ms)
        )
    engine.dispose()


async def lease_shards(url: str) -> None:
    """Two relays share the 64 shards as real relays do: 32 each after a rebalancing round."""
    engine = make_async_engine(url)
    host = socket.gethostname()
    first = ShardLeases(engine, "relay-a", host, os.getpid(), ttl_ms=60_000)
    second = ShardLeases(engine, "relay-b", host, os.getpid() + 1, ttl_ms=60_000)
    assert len(await first.heartbeat()) == 64
    assert len(await second.heartbeat()) == 0  # nothing free yet
    assert len(await first.heartbeat()) == 32  # gives back its extra shards
    assert len(await second.heartbeat()) == 32
    await engine.dispose()


async def dead_letter(bootstrap: str, topic: str, count: int) -> None:
    """``count`` dead letters, the first written ``DEAD_LETTERED_MS_AGO`` ago, then newer ones."""
    await create_topic(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        first = int(time.time() * 1000) - DEAD_LETTERED_MS_AGO
        for n in range(count):
            await producer.send_and_wait(topic, b"x", partition=0, timestamp_ms=first + n * 1000)
    finally:
        await producer.stop()


async def test_status_reports_what_was_set_up_and_thresholds_set_the_exit_code(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await create_topic(kafka_bootstrap, topic, partitions=2)
    for partition in (0, 1):
        records = [(b"k", b"{}", []) for _ in range(PARTITION_RECORDS)]
        await produce(kafka_bootstrap, topic, records, partition=partition)
    dlq = f"{topic}.dlq"
    await dead_letter(kafka_bootstrap, dlq, 4)
    group = f"billing-{topic}"  # also the inbox's consumer name: status finds it there
    await commit_offsets(
        kafka_bootstrap, group, {TopicPartition(topic, 0): 5, TopicPartition(topic, 1): 2}
    )
    set_up_outbox(pg_url, topic, group)
    await leave_an_unknown_action(pg_url)
    await lease_shards(pg_url)
    common = ("--db-url", pg_url, "--bootstrap", kafka_bootstrap, "--dlq", dlq)

    result = await cli("status", "--json", *common)
    assert result.code == 0, result.err
    report = result.json()
    assert report["sources"] == {"database": {"status": "ok"}, "kafka": {"status": "ok"}}
    assert report["unreachable"] == []
    assert report["outbox"]["status"] == "ok"
    assert report["outbox"]["backlog"] == 4
    assert report["outbox"]["parked"] == 1
    assert 120 <= report["outbox"]["oldest_age_s"] < 180
    relays = {r["relay_id"]: r for r in report["relays"]["items"]}
    assert set(relays) == {"relay-a", "relay-b"}
    assert relays["relay-a"]["shards"] == list(range(32))
    assert relays["relay-b"]["shards"] == list(range(32, 64))
    assert relays["relay-b"]["pid"] == os.getpid() + 1
    assert all(0 <= r["heartbeat_age_s"] < 60 for r in relays.values())
    assert report["shards"] == {
        "status": "ok", "total": 64, "held": 64, "free": 0, "unheld_oldest_age_s": None,
    }  # fmt: skip
    # Rows two minutes old on shards whose relays started just now: no stall yet.
    assert all(r["quiet_s"] < 60 for r in relays.values())
    assert max(r["oldest_due_age_s"] or 0 for r in relays.values()) >= 120
    actions = report["actions"]
    assert (actions["status"], actions["unknown"], actions["needs_attention"]) == ("ok", 1, 0)
    assert UNKNOWN_FOR_MS / 1000 <= actions["oldest_unknown_age_s"] < UNKNOWN_FOR_MS / 1000 + 60
    caught_up, lagging = report["consumers"]["groups"][0]["partitions"]
    assert (caught_up.pop("committed_age_s"), caught_up.pop("waiting_age_s")) == (None, None)
    assert lagging.pop("committed_age_s") is None  # committed by a client that stamps no time
    assert 0 <= lagging.pop("waiting_age_s") < 60  # the next record's age, read from Kafka
    assert report["consumers"] == {
        "status": "ok",
        "groups": [
            {
                "group": group,
                "total_lag": 3,
                "partitions": [
                    {"topic": topic, "partition": 0, "committed": 5, "end": 5, "lag": 0},
                    {"topic": topic, "partition": 1, "committed": 2, "end": 5, "lag": 3},
                ],
            }
        ],
    }
    inbox = report["inbox"]
    assert (inbox["status"], inbox["rows"], inbox["by_consumer"]) == ("ok", 3, {group: 3})
    assert inbox["last_processed_age_s"][group] > 0
    [dead] = report["dlq"]["topics"]
    assert report["dlq"]["status"] == "ok"
    assert (dead["topic"], dead["records"], dead["replayed"]) == (dlq, 4, 1)
    assert dead["partitions"] == {"0": 4}
    assert DEAD_LETTERED_MS_AGO / 1000 <= dead["oldest_age_s"] < DEAD_LETTERED_MS_AGO / 1000 + 60
    assert report["crossed"] == []

    every_dlq = (
        await cli("status", "--json", "--db-url", pg_url, "--bootstrap", kafka_bootstrap)
    ).json()
    same = [t for t in every_dlq["dlq"]["topics"] if t["topic"] == dlq]
    assert [{**t, "oldest_age_s": None} for t in same] == [{**dead, "oldest_age_s": None}]

    text = await cli("status", *common)
    assert (text.code, text.err) == (0, "")
    assert re.search(r"backlog 4, oldest unpublished 2m\d\ds old, parked 1", text.out)
    assert "relay-a" in text.out and "0-31" in text.out and "32-63" in text.out
    assert re.search(
        r"actions: 1 UNKNOWN \(0 flagged for a person\), oldest UNKNOWN for 5m\d\ds", text.out
    )
    assert f"inbox: 3 row(s) ({group} 3, last " in text.out
    assert re.search(r"10m\d\ds old", text.out)  # the oldest dead letter's age

    within = await cli(
        "status", *common, "--max-lag", "3", "--max-parked", "1", "--max-dlq", "4",
        "--max-oldest-age", "600",
    )  # fmt: skip
    assert (within.code, within.err) == (0, "")
    for limit, crossed in (
        (("--max-lag", "2"), f"consumer group {group} lags 3 record(s) (--max-lag 2)"),
        (("--max-parked", "0"), "1 parked outbox row(s) (--max-parked 0)"),
        (("--max-dlq", "3"), f"dead-letter topic {dlq} holds 4 record(s) (--max-dlq 3)"),
        (("--max-oldest-age", "60"), "oldest unpublished outbox row is"),
    ):
        result = await cli("status", "--json", *common, *limit)
        assert result.code == 1, (limit, result.err)
        assert result.err.strip().startswith(f"outboxkit: threshold crossed: {crossed}")
        assert len(result.json()["crossed"]) == 1
    several = await cli("status", *common, "--max-lag", "0", "--max-parked", "0")
    assert several.code == 1 and len(several.err.strip().splitlines()) == 2


async def outage_set_up(pg_url: str, kafka_bootstrap: str, topic: str) -> tuple[str, str]:
    """Backlog 3 (the oldest two minutes old), parked 1, one UNKNOWN action, 3 inbox rows;
    a group lagging 3 records, a dead-letter topic of 2 records. Returns (group, dlq)."""
    await create_topic(kafka_bootstrap, topic)
    await produce(kafka_bootstrap, topic, [(b"k", b"{}", []) for _ in range(5)])
    dlq = f"{topic}.dlq"
    await dead_letter(kafka_bootstrap, dlq, 2)
    group = f"billing-{topic}"
    await commit_offsets(kafka_bootstrap, group, {TopicPartition(topic, 0): 2})
    set_up_outbox(pg_url, topic, group, pending=3)
    await leave_an_unknown_action(pg_url)
    return group, dlq


def assert_database_numbers(report: dict, text: str) -> None:
    """The database's sections as set up by :func:`outage_set_up`, in JSON and in text."""
    assert report["sources"]["database"] == {"status": "ok"}
    outbox = report["outbox"]
    assert (outbox["status"], outbox["backlog"], outbox["parked"]) == ("ok", 3, 1)
    assert outbox["oldest_age_s"] >= 120
    assert report["actions"]["unknown"] == 1 and report["actions"]["oldest_unknown_age_s"] >= 300
    assert report["inbox"]["rows"] == 3
    assert report["relays"] == {"status": "ok", "items": []}
    assert report["shards"]["free"] == 64
    assert re.search(r"outbox: backlog 3, oldest unpublished 2m\d\ds old, parked 1", text)
    assert re.search(r"actions: 1 UNKNOWN .*oldest UNKNOWN for 5m\d\ds", text)
    assert "inbox: 3 row(s)" in text
    assert "relays: none registered (0 of 64 shards leased)" in text


def assert_kafka_numbers(report: dict, text: str, group: str, dlq: str) -> None:
    """The broker's sections as set up by :func:`outage_set_up`, in JSON and in text."""
    assert report["sources"]["kafka"] == {"status": "ok"}
    assert report["consumers"]["status"] == "ok"
    assert [(g["group"], g["total_lag"]) for g in report["consumers"]["groups"]] == [(group, 3)]
    [dead] = [t for t in report["dlq"]["topics"] if t["topic"] == dlq]
    assert (dead["status"], dead["records"]) == ("ok", 2)
    assert dead["oldest_age_s"] >= DEAD_LETTERED_MS_AGO / 1000
    assert "consumer lag" in text and group in text
    assert dlq in text and re.search(r"10m\d\ds old", text)


@pytest.mark.parametrize("broker", ["refused", "mute"])
async def test_broker_down_still_reports_the_database(
    pg_url: str, kafka_bootstrap: str, topic: str, mute_server: str, broker: str
) -> None:
    group, _ = await outage_set_up(pg_url, kafka_bootstrap, topic)
    bootstrap = DOWN_BROKER if broker == "refused" else mute_server
    # No relay runs here: the rows' stall (exit 1) is not what this test is about.
    common = ("--db-url", pg_url, "--bootstrap", bootstrap, "--timeout", "1", "--max-stall", "1d")
    why = "unreachable (connecting)" if broker == "refused" else "did not answer within 1 s"

    as_json = await cli("status", "--json", *common)
    text = await cli("status", *common)
    for result in (as_json, text):
        assert result.code == 3, result.err
        assert result.seconds < 8
        [line] = result.err.strip().splitlines()
        assert line.startswith(f"outboxkit: unreachable: kafka at {bootstrap} ")
        assert why in line
    report = as_json.json()
    assert_database_numbers(report, text.out)
    kafka = report["sources"]["kafka"]
    assert kafka["status"] == "unreachable" and why in kafka["cause"]
    assert report["consumers"] == kafka and report["dlq"] == kafka
    assert f"consumer lag: unreachable: kafka at {bootstrap} " in text.out
    assert f"dead letters: unreachable: kafka at {bootstrap} " in text.out

    # A threshold crossed on what could be read is still named, but 3 wins over 1.
    both = await cli("status", *common, "--max-parked", "0", "--group", group)
    assert both.code == 3
    assert both.err.splitlines() == [
        "outboxkit: threshold crossed: 1 parked outbox row(s) (--max-parked 0)",
        line,
    ]


async def test_database_down_still_reports_lag_and_dead_letters(
    kafka_bootstrap: str, pg_url: str, topic: str, mute_server: str
) -> None:
    group, dlq = await outage_set_up(pg_url, kafka_bootstrap, topic)
    kafka = ("--bootstrap", kafka_bootstrap, "--group", group, "--dlq", dlq)

    as_json = await cli("status", "--json", "--db-url", DOWN_DB, *kafka)
    text = await cli("status", "--db-url", DOWN_DB, *kafka)
    for result in (as_json, text):
        assert result.code == 3, result.err
        assert SECRET not in result.out + result.err
        [line] = result.err.strip().splitlines()
        assert line.startswith(
            "outboxkit: unreachable: database postgresql://postgres:***@127.0.0.1:1/outbox "
            "unreachable"
        )
    report = as_json.json()
    assert_kafka_numbers(report, text.out, group, dlq)
    [dead] = report["dlq"]["topics"]
    assert dead["replayed"] is None  # the replay ledger is in the database
    database = report["sources"]["database"]
    assert database["status"] == "unreachable" and "127.0.0.1:1" in database["cause"]
    for section in ("outbox", "relays", "shards", "actions", "inbox"):
        assert report[section] == database, section
        if section != "shards":  # the shards are in the relays' line
            assert f"{section}: unreachable: database postgresql://postgres:***@" in text.out

    # Without --group the groups come from the inbox: lag says how to get it back.
    unnamed = await cli("status", "--json", "--db-url", DOWN_DB, "--bootstrap", kafka_bootstrap)
    assert unnamed.code == 3
    assert "name them with --group" in unnamed.json()["consumers"]["cause"]

    host, port = mute_server.split(":")
    hung = f"postgresql://postgres:{SECRET}@{host}:{port}/outbox"
    silent = await cli("status", "--json", "--db-url", hung, *kafka, "--timeout", "1")
    assert silent.code == 3 and silent.seconds < 8
    assert "did not answer within 1 s" in silent.json()["sources"]["database"]["cause"]
    assert_kafka_numbers(silent.json(), text.out, group, dlq)
    assert SECRET not in silent.out + silent.err


async def test_both_down_reports_every_section_unreachable(mute_server: str) -> None:
    host, port = mute_server.split(":")
    hung = f"postgresql://postgres:{SECRET}@{host}:{port}/outbox"
    both = ("--db-url", hung, "--bootstrap", mute_server, "--group", "billing", "--timeout", "1")
    silent = await cli("status", "--json", *both)
    assert silent.code == 3 and silent.seconds < 8  # the two sources wait at the same time
    report = silent.json()
    assert SECRET not in silent.out + silent.err
    for section in ("outbox", "relays", "shards", "actions", "inbox", "consumers", "dlq"):
        assert report[section]["status"] == "unreachable", section
        assert "did not answer within 1 s" in report[section]["cause"], section
    assert len(silent.err.strip().splitlines()) == 2


def test_both_down_reports_every_section_unreachable_as_a_process() -> None:
    common = ("--db-url", DOWN_DB, "--bootstrap", DOWN_BROKER, "--group", "billing")
    as_json = cli_process("status", "--json", *common)
    text = cli_process("status", *common)
    for result in (as_json, text):
        assert result.code == 3, result.err
        assert "Traceback" not in result.err and SECRET not in result.out + result.err
        database, broker = result.err.strip().splitlines()
        assert database.startswith("outboxkit: unreachable: database postgresql://postgres:***@")
        assert broker.startswith(f"outboxkit: unreachable: kafka at {DOWN_BROKER} unreachable")
    report = as_json.json()
    assert report["unreachable"] == [
        line[len("outboxkit: unreachable: ") :] for line in (as_json.err.strip().splitlines())
    ]
    for section in ("outbox", "relays", "shards", "actions", "inbox", "consumers", "dlq"):
        assert report[section]["status"] == "unreachable", section
    lines = text.out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "outbox", "relays", "actions", "inbox", "consumer lag", "dead letters",
    ]  # fmt: skip
    assert all(": unreachable: " in line for line in lines)


async def test_one_missing_dlq_topic_is_marked_and_the_others_counted(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    group, dlq = await outage_set_up(pg_url, kafka_bootstrap, topic)
    missing = f"{topic}.gone.dlq"
    common = ("--db-url", pg_url, "--bootstrap", kafka_bootstrap, "--dlq", dlq, "--dlq", missing)
    common += ("--max-stall", "1d")  # no relay runs here: the rows' stall is another test's

    as_json = await cli("status", "--json", *common)
    text = await cli("status", *common)
    for result in (as_json, text):
        assert result.code == 3, result.err
        assert result.err.strip().splitlines() == [
            f"outboxkit: unreachable: dead-letter topic {missing}: topic {missing!r} does not "
            f"exist on {kafka_bootstrap}"
        ]
    report = as_json.json()
    assert_database_numbers(report, text.out)
    assert_kafka_numbers(report, text.out, group, dlq)
    assert report["dlq"]["status"] == "partial"
    assert {"topic": missing, "status": "unreachable", "cause": (
        f"topic {missing!r} does not exist on {kafka_bootstrap}"
    )} in report["dlq"]["topics"]  # fmt: skip
    assert f"dead letters in {missing}: unreachable: topic {missing!r} does not exist" in text.out
    # The replay ledger's row for offset 1 (set_up_outbox) counts: the database was read.
    assert [t["replayed"] for t in report["dlq"]["topics"] if t["topic"] == dlq] == [1]


async def test_watch_redraws_in_place_until_ctrl_c(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    await outage_set_up(pg_url, kafka_bootstrap, topic)
    log = tmp_path / "watch.log"
    # A terminal as rich sees one (the redraw is cursor movement), with the broker down.
    process = start_cli(
        ["status", "--watch", "0.5", "--db-url", pg_url, "--bootstrap", DOWN_BROKER],
        log,
        env={"TTY_COMPATIBLE": "1", "TERM": "xterm", "COLUMNS": "200"},
    )
    try:
        frames = await wait_for(
            lambda: log.read_text(errors="replace").count("(Ctrl-C to quit)"),
            lambda count: count >= 2,
            timeout=60,
            what="two redraws of status --watch",
        )
        assert frames >= 2
        process.send_signal(signal.SIGINT)
        code = await asyncio.to_thread(process.wait, 30)
    finally:
        terminate(process)
    output = log.read_text(errors="replace")
    assert code == 0, output
    assert "Traceback" not in output and "Unclosed" not in output
    assert "\x1b[" in output  # redrawn in place: the cursor moves back over the last frame
    assert re.search(r"outbox: backlog 3, oldest unpublished 2m\d\ds old", output)
    assert "consumer lag: unreachable: kafka at 127.0.0.1:1 unreachable" in output
    assert "unreachable: kafka at 127.0.0.1:1" in output


def test_a_cause_masks_the_password_as_a_word_and_shows_the_operators_url() -> None:
    driver_url = "postgresql+asyncpg://postgres:***@127.0.0.1:1/x?sslmode=disable"
    given_url = "postgresql://postgres:***@127.0.0.1:1/x"
    error = OpsError(f"database {driver_url} unreachable: password postgres refused")
    line = cause_line(error, ["postgres"], replace=(driver_url, given_url))
    assert line == "database postgresql://***:***@127.0.0.1:1/x unreachable: password *** refused"


async def test_dead_letter_counts_leave_the_discarded_letters_out(
    pg_url: str, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OUTBOXKIT_DB_URL", raising=False)
    topic = f"status-discard-{uuid.uuid4().hex[:8]}"
    dlq = await dead_letters_of_two_causes(kafka_bootstrap, topic)  # 6: 4 Limit, 2 Timeout
    where = ("--db-url", pg_url, "--bootstrap", kafka_bootstrap)
    discarded = await cli(
        "dlq", "discard", dlq, "--error-class", "Timeout", "--reason", "re-entered", *where,
        "--json",
    )  # fmt: skip
    assert (discarded.code, discarded.json()["changed"]) == (0, 2), discarded.err

    result = await cli("status", "--json", *where, "--dlq", dlq)
    assert result.code == 0, result.err
    [dead] = result.json()["dlq"]["topics"]
    assert (dead["records"], dead["discarded"], dead["held"]) == (4, 2, 6)
    # the threshold counts the letters left to handle
    assert (await cli("status", *where, "--dlq", dlq, "--max-dlq", "4")).code == 0
    crossed = await cli("status", *where, "--dlq", dlq, "--max-dlq", "3")
    assert crossed.code == 1 and f"{dlq} holds 4 record(s)" in crossed.err
    text = await cli("status", *where, "--dlq", dlq)
    assert "DISCARDED" in text.out
    assert re.search(rf"{re.escape(dlq)}\s*│\s*4\s*│\s*2\s*│\s*0\s*│", text.out), text.out
    # without the database, every letter held counts and the discards are unknown
    blind = (await cli("status", "--json", "--db-url", DOWN_DB, "--bootstrap", kafka_bootstrap,
                       "--dlq", dlq, "--timeout", "2")).json()  # fmt: skip
    [dead] = blind["dlq"]["topics"]
    assert (dead["records"], dead["discarded"], dead["held"]) == (6, None, 6)


def park_and_schedule_beyond_the_cap(url: str, parked: int, scheduled: int) -> None:
    """``parked`` parked rows and ``scheduled`` rows due in a day, in one statement each."""
    engine = make_engine(url)
    with engine.begin() as connection:
        for state, count in (("parked", parked), ("scheduled", scheduled)):
            connection.execute(
                text(
                    "INSERT INTO outbox_events (source, event_id, type, topic, shard, headers,"
                    " payload, created_ms, available_ms, attempts, parked_ms, deliver_at_ms)"
                    " SELECT '/cap', :state || n, 't', 'orders', n % 64, '{}', 'x', 1, 1, 0,"
                    " CASE WHEN :state = 'parked' THEN 1 END,"
                    " CASE WHEN :state = 'scheduled' THEN :due + n END"
                    " FROM generate_series(1, :count) AS n"
                ),
                {"state": state, "count": count, "due": int(time.time() * 1000) + 86_400_000},
            )
    engine.dispose()


async def test_parked_and_scheduled_rows_are_counted_up_to_a_cap_and_said_so(
    pg_url: str, kafka_bootstrap: str
) -> None:
    """Past COUNT_CAP the status says "at least" (text, JSON, console's fields) instead of
    counting every row each time; a --max-parked above the cap is still judged on the rows."""
    park_and_schedule_beyond_the_cap(pg_url, COUNT_CAP + 5, COUNT_CAP + 3)
    where = ("--db-url", pg_url, "--bootstrap", kafka_bootstrap)

    report = (await cli("status", "--json", *where)).json()["outbox"]
    assert (report["parked"], report["parked_at_least"]) == (COUNT_CAP, True)
    assert (report["scheduled"], report["scheduled_at_least"]) == (COUNT_CAP, True)
    assert report["backlog"] == 0 and report["next_due_in_s"] > 86_000
    text_report = await cli("status", *where)
    assert f"parked ≥ {COUNT_CAP}, scheduled ≥ {COUNT_CAP}" in text_report.out, text_report.out

    below = await cli("status", *where, "--max-parked", str(COUNT_CAP + 5))
    assert below.code == 0 and "threshold crossed" not in below.err, below.err
    above = await cli("status", *where, "--max-parked", str(COUNT_CAP + 4))
    assert above.code == 1 and "parked outbox row(s) (--max-parked" in above.err, above.err


async def test_rows_due_with_no_relay_holding_their_shards_are_a_stall_by_default(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await outage_set_up(pg_url, kafka_bootstrap, topic)  # rows two minutes old, no relay
    common = ("status", "--db-url", pg_url, "--bootstrap", kafka_bootstrap)
    stalled = await cli(*common)
    assert stalled.code == 1, stalled.err
    [line] = stalled.err.strip().splitlines()
    assert re.fullmatch(
        r"outboxkit: threshold crossed: outbox stalled: a row has been due for 1\d\d s on 64 "
        r"shard\(s\) no live relay holds \(--max-stall 60\)",
        line,
    ), line
    assert (await cli(*common, "--max-stall", "1h")).code == 0
