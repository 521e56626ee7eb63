"""The WAL-message format of ``Outbox(wal_messages=True)``, and its fallback off PostgreSQL."""

from __future__ import annotations

import json

import pytest
from outboxkit.outbox import Outbox, new_event, wal_message
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.events import encode_binary
from outboxkit.outbox.tables import outbox_events
from outboxkit.outbox.writer import outbox_row
from sqlalchemy import func, insert, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from tests.relay.test_logical import make_slot, relay_for, rows_left
from tests.relay.test_processes import KEYS, check_order
from tests.support.kafka import read_topic
from tests.support.waits import scaled


@pytest.mark.parametrize("key", ["k-1", None])
def test_a_row_survives_the_message_format(key: str | None) -> None:
    event = new_event("t", "/src", {"ü": "x" * 3000}, partitionkey=key)
    row = outbox_row(encode_binary(event), "topic.a")
    decoded = wal_message.decode(wal_message.encode(row))
    assert decoded == {name: row[name] for name in decoded}
    assert set(row) - set(decoded) == {"shard"}  # derived from the key and id again


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="version"):
        wal_message.decode(b"\x07rest")


def test_wal_messages_on_sqlite_go_to_the_table(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    with Session(engine) as session, session.begin():
        event = new_event("t", "/src", {"n": 1})
        assert Outbox(default_topic="a", wal_messages=True).add(session, event)
        assert not Outbox(default_topic="a", wal_messages=True).add(session, event)  # dedup
    with engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(outbox_events)) == 1
    engine.dispose()


def write_at_commit(url: str, topic: str, count: int, per_tx: int) -> None:
    """Events ``0..count`` over KEYS keys, each transaction's first half as rows and second
    half as messages sent with the COMMIT; and a rolled-back transaction of both kinds."""
    engine = make_engine(url)
    rows = Outbox(default_topic=topic)
    messages = Outbox(default_topic=topic, wal_messages=True, emit_at_commit=True)
    for start in range(0, count, per_tx):
        with Session(engine) as session, session.begin():
            seqs = range(start, min(start + per_tx, count))
            for seq in seqs:
                event = new_event("seq", "/test", {"seq": seq}, partitionkey=f"key-{seq % KEYS}")
                # messages are sent after the transaction's other statements: rows go first
                assert (messages if seq - start >= len(seqs) // 2 else rows).add(session, event)
    with Session(engine) as session, session.begin():
        for outbox in (rows, messages):
            outbox.add(session, new_event("seq", "/t", {"seq": 10**6}, partitionkey="key-0"))
        session.rollback()
    engine.dispose()


async def test_messages_at_commit_are_published_in_add_order_with_the_inserts(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await make_slot(pg_url, kafka_bootstrap)
    write_at_commit(pg_url, topic, 300, per_tx=6)
    assert rows_left(pg_url)["pending"] == 150, "the messages wrote no rows"
    relay = relay_for(pg_url, kafka_bootstrap)
    assert await relay.drain(timeout_s=scaled(60)) == 300
    records = await read_topic(kafka_bootstrap, topic, expected=300)
    check_order(records, 300, allow_duplicates=False)  # the rolled-back seq would fail it
    seqs = [json.loads(record.value)["seq"] for record in records]
    assert seqs == list(range(300)), "one partition: exactly commit (and add) order"


def test_an_emit_failing_at_commit_fails_the_commit_and_leaves_nothing(pg_url: str) -> None:
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)  # one connection throughout
    with engine.begin() as conn:  # an emit function of this database's own that always fails
        conn.execute(text(_REFUSING_EMIT))
    outbox = Outbox(default_topic="a", wal_messages=True, emit_at_commit=True)
    with Session(engine) as session:
        session.execute(text("SET search_path = public, pg_catalog"))  # finds the failing one
        session.commit()
        with pytest.raises(DBAPIError, match="emit refused"), session.begin():
            outbox.add(session, new_event("t", "/src", {"n": 1}))
            outbox.add(session, new_event("t", "/src", {"n": 2}, partitionkey="k"))
            session.execute(insert(outbox_events).values(**_A_ROW))  # the transaction's row
            assert rows_in(session) == 1
        assert rows_in(session) == 0, "nothing of the failed transaction is visible"
        session.commit()
        with session.begin():  # the session and its connection work on
            session.execute(insert(outbox_events).values(**_A_ROW))
        assert rows_in(session) == 1
    engine.dispose()


def test_a_message_in_a_savepoint_is_emitted_at_once_after_the_kept_ones(pg_url: str) -> None:
    engine = make_engine(pg_url)
    outbox = Outbox(default_topic="a", wal_messages=True, emit_at_commit=True)
    with Session(engine) as session, session.begin():
        outbox.add(session, new_event("t", "/src", {"n": 1}))
        assert len(kept(session)) == 1
        with session.begin_nested():
            outbox.add(session, new_event("t", "/src", {"n": 2}))
        assert kept(session) == [], "both executed, in add order"
    engine.dispose()


def test_a_savepoint_released_with_messages_kept_commits_nothing(pg_url: str) -> None:
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)  # one connection throughout
    outbox = Outbox(default_topic="a", wal_messages=True, emit_at_commit=True)
    with Session(engine) as session:
        with session.begin():
            outbox.add(session, new_event("t", "/src", {"n": 1}))
            session.execute(insert(outbox_events).values(**_A_ROW))
            with session.begin_nested():  # its release is no commit: the message stays kept
                pass
            assert len(kept(session)) == 1
            session.rollback()
        assert rows_in(session) == 0, "the release sent no COMMIT"
        assert kept(session) == [], "the rollback dropped the kept message"
        session.rollback()
    engine.dispose()


def kept(session: Session) -> list[bytes]:
    """The messages waiting for the commit of the session's connection."""
    return list(session.connection().info.get("outboxkit.wal_at_commit", []))


def rows_in(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(outbox_events)) or 0


_REFUSING_EMIT = """
CREATE FUNCTION public.pg_logical_emit_message(boolean, text, bytea) RETURNS pg_lsn
LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'emit refused'; END $$
"""
_A_ROW = {
    "source": "/src",
    "event_id": "row-1",
    "type": "t",
    "topic": "a",
    "shard": 0,
    "headers": "{}",
    "payload": b"{}",
    "created_ms": 0,
    "available_ms": 0,
    "attempts": 0,
}
