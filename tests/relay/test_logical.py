"""The relay in logical mode: outbox inserts read from a replication slot, real PostgreSQL and
Kafka. Every database here is dropped with its slots (outboxkit.testing.postgres)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay import Relay, RelayOptions
from outboxkit.relay.slot import Slot
from outboxkit.testing.processes import kill, start_cli, terminate
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from tests.relay.test_processes import KEYS, check_order, lease_holders, write_sequence
from tests.support.kafka import read_topic, wait_for
from tests.support.ops import cli

LOGICAL = RelayOptions(
    lease_ttl_s=4.0, request_timeout_s=2.0, poll_interval_s=0.2, mode="logical", max_attempts=2
)


# A relay process's start on a loaded machine: its imports alone took 20 s at load 20; the
# waits for processes are sized for that, not for a quiet machine.
STARTUP_S = 240


def rows_left(url: str) -> dict[str, int]:
    engine = make_engine(url)
    with engine.connect() as conn:
        pending, parked = conn.execute(
            select(
                func.count().filter(outbox_events.c.parked_ms.is_(None)),
                func.count().filter(outbox_events.c.parked_ms.is_not(None)),
            )
        ).one()
    engine.dispose()
    return {"pending": pending, "parked": parked}


def slot_exists(url: str) -> bool:
    engine = make_engine(url)
    with engine.connect() as conn:
        found = conn.scalar(
            text("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()")
        )
    engine.dispose()
    return bool(found)


async def make_slot(url: str, bootstrap: str) -> None:
    """Create the slot (and publish the rows before it) with a drain, so what a test writes
    next comes from the slot only (rows committed during a slot's creation may go twice)."""
    assert await relay_for(url, bootstrap).drain(timeout_s=60) == 0


def relay_for(url: str, bootstrap: str, **changes: object) -> Relay:
    options = RelayOptions(**{**LOGICAL.__dict__, **changes})  # type: ignore[arg-type]
    return Relay(db_url=url, kafka=KafkaSettings(bootstrap=bootstrap), options=options)


async def test_committed_inserts_are_published_in_key_order_and_rolled_back_ones_never(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await make_slot(pg_url, kafka_bootstrap)
    async with relay_for(pg_url, kafka_bootstrap) as relay:
        write_sequence(pg_url, topic, 0, 300, per_tx=7)
        engine = make_engine(pg_url)
        with Session(engine) as session, session.begin():
            Outbox(default_topic=topic).add(
                session, new_event("seq", "/test", {"seq": 999}, partitionkey="key-0")
            )
            session.rollback()
        engine.dispose()
        await wait_for(lambda: rows_left(pg_url)["pending"], lambda n: n == 0, 60, "all deleted")
    assert relay.stats.published == 300
    records = await read_topic(kafka_bootstrap, topic, expected=300)
    check_order(records, 300, allow_duplicates=False)  # the rolled-back seq 999 would fail it


async def test_a_restarted_relay_resumes_from_the_confirmed_position(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    write_sequence(pg_url, topic, 0, 100)  # before the slot: published from the table first
    assert await relay_for(pg_url, kafka_bootstrap).drain(timeout_s=60) == 100
    write_sequence(pg_url, topic, 100, 150, per_tx=10)
    assert await relay_for(pg_url, kafka_bootstrap).drain(timeout_s=60) == 150
    records = await read_topic(kafka_bootstrap, topic, expected=250)
    check_order(records, 250, allow_duplicates=False)
    assert rows_left(pg_url) == {"pending": 0, "parked": 0}


async def test_a_crash_after_the_kafka_ack_before_the_advance_duplicates_and_loses_nothing(
    pg_url: str, kafka_bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await make_slot(pg_url, kafka_bootstrap)
    write_sequence(pg_url, topic, 0, 120, per_tx=12)

    acknowledged: list[int] = []

    async def crash(self: Slot, lsn: int, published_ids: list[int]) -> None:
        # No confirmation reaches the database; the process dies once Kafka acknowledged all
        # (how many batches the stream cuts the 120 rows into depends on timing).
        acknowledged.extend(published_ids)
        if len(acknowledged) >= 120:
            raise RuntimeError("the process died here")

    with monkeypatch.context() as patched:
        patched.setattr(Slot, "confirm", crash)
        with pytest.raises(RuntimeError, match="died here"):
            await relay_for(pg_url, kafka_bootstrap).drain(timeout_s=60)
    first = await read_topic(kafka_bootstrap, topic, expected=120)
    assert len(first) == 120, "everything was acknowledged by Kafka before the crash"
    assert rows_left(pg_url)["pending"] == 120, "nothing was confirmed"
    assert await relay_for(pg_url, kafka_bootstrap).drain(timeout_s=60) == 120
    records = await read_topic(kafka_bootstrap, topic, expected=240)
    assert check_order(records, 120, allow_duplicates=True) == 120
    assert rows_left(pg_url)["pending"] == 0


async def test_a_row_kafka_refuses_is_parked_and_the_stream_goes_on(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    engine = make_engine(pg_url)
    await make_slot(pg_url, kafka_bootstrap)
    relay = relay_for(pg_url, kafka_bootstrap, max_request_size=4096)
    async with relay:
        outbox = Outbox(default_topic=topic)
        with Session(engine) as session, session.begin():
            outbox.add(session, new_event("big", "/test", {"fill": "x" * 8000}, partitionkey="k"))
            for seq in range(5):
                outbox.add(session, new_event("seq", "/test", {"seq": seq}, partitionkey="k"))
        await wait_for(lambda: rows_left(pg_url), lambda r: r["parked"] == 1, 60, "parked")
        await wait_for(lambda: rows_left(pg_url)["pending"], lambda n: n == 0, 60, "rest sent")
    engine.dispose()
    records = await read_topic(kafka_bootstrap, topic, expected=5)
    assert [json.loads(r.value)["seq"] for r in records] == [0, 1, 2, 3, 4]
    assert relay.stats.failed == 2  # max_attempts=2: once from the stream, once from the table
    status = await cli("status", "--db-url", pg_url, "--json", "--bootstrap", kafka_bootstrap)
    assert status.json()["outbox"]["parked"] == 1


async def test_a_scheduled_row_is_published_when_due_from_the_table(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    engine = make_engine(pg_url)
    await make_slot(pg_url, kafka_bootstrap)
    async with relay_for(pg_url, kafka_bootstrap):
        outbox = Outbox(default_topic=topic)
        before_ms = time.time() * 1000
        with Session(engine) as session, session.begin():
            outbox.add(session, new_event("later", "/t", {"seq": 1}, partitionkey="k"), delay_s=1.5)
            outbox.add(session, new_event("now", "/t", {"seq": 0}, partitionkey="k"))
        await wait_for(lambda: rows_left(pg_url)["pending"], lambda n: n == 1, 60, "now sent")
        # On a loaded machine the later row may come due while the topic is read: what
        # matters is that "now" went first, and "later" not before its time (below).
        first = await read_topic(kafka_bootstrap, topic, expected=1)
        assert json.loads(first[0].value)["seq"] == 0
        await wait_for(lambda: rows_left(pg_url)["pending"], lambda n: n == 0, 60, "later sent")
    engine.dispose()
    records = await read_topic(kafka_bootstrap, topic, expected=2)
    assert [json.loads(r.value)["seq"] for r in records] == [0, 1]
    assert records[1].timestamp >= before_ms + 1500  # not before its time (one clock)


async def test_status_shows_the_slot_lag_and_exits_1_over_the_threshold(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await make_slot(pg_url, kafka_bootstrap)
    write_sequence(pg_url, topic, 0, 50)
    args = ("status", "--db-url", pg_url, "--bootstrap", kafka_bootstrap)
    behind = await cli(*args, "--json", "--max-slot-lag-bytes", "1000", "--max-slot-age", "3600")
    assert behind.code == 1
    (slot,) = behind.json()["slots"]["items"]
    assert slot["lag_bytes"] > 1000 and slot["oldest_unconfirmed_age_s"] is not None
    assert any("--max-slot-lag-bytes 1000" in line for line in behind.json()["crossed"])
    assert await relay_for(pg_url, kafka_bootstrap).drain(timeout_s=60) == 50
    caught_up = await cli(*args, "--json", "--max-slot-age", "0")
    assert caught_up.json()["slots"]["items"][0]["oldest_unconfirmed_age_s"] is None
    assert caught_up.code == 0


@pytest.mark.timeout(4 * STARTUP_S)
async def test_a_standby_relay_takes_the_slot_over_when_the_active_one_is_killed(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    args = ["relay", "--db-url", pg_url, "--bootstrap", kafka_bootstrap, "--mode", "logical"]
    args += ["--lease-ttl", "3", "--request-timeout-ms", "1500", "--poll-interval", "0.2"]
    first = start_cli(args, tmp_path / "first.log")
    second = None
    try:
        await wait_for(lambda: lease_holders(pg_url), lambda h: len(h) == 1, STARTUP_S, "a holder")
        second = start_cli(args, tmp_path / "second.log")
        await wait_for(
            lambda: (tmp_path / "second.log").read_text(),
            lambda log: " started" in log,
            STARTUP_S,
            "up",
        )
        write_sequence(pg_url, topic, 0, 500, per_tx=5)
        await wait_for(
            lambda: rows_left(pg_url)["pending"], lambda n: n < 500, STARTUP_S, "some sent"
        )
        kill(first)
        write_sequence(pg_url, topic, 500, 500, per_tx=5)
        await wait_for(
            lambda: rows_left(pg_url)["pending"], lambda n: n == 0, STARTUP_S, "all sent"
        )
        assert "holds slot" in (tmp_path / "second.log").read_text()
    finally:
        kill(first)
        if second is not None:
            assert terminate(second) == 0
    records = await read_topic(kafka_bootstrap, topic, expected=1000)
    check_order(records, 1000, allow_duplicates=True)


async def test_logical_mode_is_refused_in_one_line_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    result = await cli("relay", "--db-url", url, "--bootstrap", "127.0.0.1:1", "--mode", "logical")
    assert result.code == 2
    assert result.error_line() == (
        "outboxkit: error: --mode logical needs PostgreSQL; SQLite relays poll (--mode poll)"
    )


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        RelayOptions(mode="stream")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="slot name"):
        RelayOptions(mode="logical", slot_name="Bad-Name")


async def test_drop_slot_drops_it_and_the_next_relay_republishes_from_the_table(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    assert await relay_for(pg_url, kafka_bootstrap).drain(timeout_s=60) == 0
    write_sequence(pg_url, topic, 0, 40)
    dropped = await cli("relay", "--db-url", pg_url, "--bootstrap", kafka_bootstrap, "--drop-slot")
    assert dropped.code == 0, dropped
    assert not slot_exists(pg_url)
    assert await relay_for(pg_url, kafka_bootstrap).drain(timeout_s=60) == 40
    records = await read_topic(kafka_bootstrap, topic, expected=40)
    check_order(records, 40, allow_duplicates=False)


async def test_the_sql_reader_publishes_in_order_and_resumes_from_the_confirmed_position(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await make_slot(pg_url, kafka_bootstrap)
    write_sequence(pg_url, topic, 0, 100, per_tx=7)
    sql = {"logical_reader": "sql"}
    assert await relay_for(pg_url, kafka_bootstrap, **sql).drain(timeout_s=60) == 100
    write_sequence(pg_url, topic, 100, 60, per_tx=6)
    assert await relay_for(pg_url, kafka_bootstrap).drain(timeout_s=60) == 60  # the stream
    records = await read_topic(kafka_bootstrap, topic, expected=160)
    check_order(records, 160, allow_duplicates=False)


def write_mixed(url: str, topic: str, count: int, per_tx: int) -> None:
    """Events ``0..count`` over KEYS keys, even seqs as rows, odd ones as WAL messages, in
    one transaction per ``per_tx``; and a rolled-back transaction of both kinds."""
    engine = make_engine(url)
    rows, messages = Outbox(default_topic=topic), Outbox(default_topic=topic, wal_messages=True)
    for start in range(0, count, per_tx):
        with Session(engine) as session, session.begin():
            for seq in range(start, min(start + per_tx, count)):
                event = new_event("seq", "/test", {"seq": seq}, partitionkey=f"key-{seq % KEYS}")
                assert (messages if seq % 2 else rows).add(session, event)
    with Session(engine) as session, session.begin():
        for outbox in (rows, messages):
            outbox.add(session, new_event("seq", "/t", {"seq": 10**6}, partitionkey="key-0"))
        session.rollback()
    engine.dispose()


async def test_wal_messages_are_published_in_commit_order_with_the_inserts(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await make_slot(pg_url, kafka_bootstrap)
    write_mixed(pg_url, topic, 300, per_tx=5)
    assert rows_left(pg_url)["pending"] == 150, "the messages wrote no rows"
    relay = relay_for(pg_url, kafka_bootstrap)
    assert await relay.drain(timeout_s=60) == 300, "drain waits for the messages in the slot"
    records = await read_topic(kafka_bootstrap, topic, expected=300)
    check_order(records, 300, allow_duplicates=False)  # the rolled-back seq would fail it
    seqs = [json.loads(record.value)["seq"] for record in records]
    assert seqs == list(range(300)), "one partition: exactly commit (and write) order"
    assert rows_left(pg_url) == {"pending": 0, "parked": 0}


async def test_a_wal_message_kafka_refuses_is_parked_in_the_table(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    engine = make_engine(pg_url)
    await make_slot(pg_url, kafka_bootstrap)
    outbox = Outbox(default_topic=topic, wal_messages=True)
    with Session(engine) as session, session.begin():
        outbox.add(session, new_event("big", "/test", {"fill": "x" * 8000}, partitionkey="k"))
        outbox.add(session, new_event("seq", "/test", {"seq": 0}, partitionkey="k"))
    engine.dispose()
    relay = relay_for(pg_url, kafka_bootstrap, max_request_size=4096)
    async with relay:
        await wait_for(lambda: rows_left(pg_url), lambda r: r["parked"] == 1, 60, "parked")
    assert rows_left(pg_url)["pending"] == 0
    records = await read_topic(kafka_bootstrap, topic, expected=1)
    assert [json.loads(r.value)["seq"] for r in records] == [0]
    assert relay.stats.failed == 2  # once from the stream, once from the table


async def test_a_scheduled_add_with_wal_messages_goes_to_the_table(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    engine = make_engine(pg_url)
    await make_slot(pg_url, kafka_bootstrap)
    async with relay_for(pg_url, kafka_bootstrap):
        outbox = Outbox(default_topic=topic, wal_messages=True)
        before_ms = time.time() * 1000
        with Session(engine) as session, session.begin():
            # 5 s: the check below must come before it is due, even on a loaded machine.
            outbox.add(session, new_event("later", "/t", {"seq": 1}, partitionkey="k"), delay_s=5)
            outbox.add(session, new_event("now", "/t", {"seq": 0}, partitionkey="k"))
        assert rows_left(pg_url)["pending"] == 1, "the scheduled event is a row"
        await wait_for(lambda: rows_left(pg_url)["pending"], lambda n: n == 0, 60, "later sent")
    engine.dispose()
    records = await read_topic(kafka_bootstrap, topic, expected=2)
    assert [json.loads(r.value)["seq"] for r in records] == [0, 1]
    assert records[1].timestamp >= before_ms + 5000  # same machine: one clock
