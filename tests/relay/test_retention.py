"""The outbox's retention pass deletes published rows older than the window, and nothing else."""

from __future__ import annotations

import asyncio

import pytest
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.purge import delete_in_chunks
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay.retention import delete_published
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session

from tests.support.locks import locks_left_by_scripts
from tests.support.waits import scaled

HOUR_MS = 3_600_000
STATES = ("pending", "parked", "scheduled", "recent", "old")


def write_rows(url: str, counts: dict[str, int]) -> None:
    """``counts[state]`` outbox rows in each state; ``old`` ones published two hours ago
    (three of them at the same millisecond, so a tie straddles chunks), ``recent`` ones a
    minute ago, ``parked`` ones parked two hours ago, ``scheduled`` ones due in a day."""
    engine = make_engine(url)
    outbox = Outbox(default_topic="retention")
    c = outbox_events.c
    with Session(engine) as session, session.begin():
        now = session.scalar(select(dialect_of(session).now_ms()))
        assert now is not None
        for state in STATES:
            events = [new_event("t", f"/{state}", {"n": n}) for n in range(counts[state])]
            for event in events:
                outbox.add(session, event)
            session.flush()
            rows = c.source == f"/{state}"
            if state == "old":
                session.execute(
                    update(outbox_events)
                    .where(rows)
                    .values(published_ms=now - 2 * HOUR_MS - c.id % 2)
                )
            elif state == "recent":
                session.execute(update(outbox_events).where(rows).values(published_ms=now - 60_000))
            elif state == "parked":
                session.execute(
                    update(outbox_events)
                    .where(rows)
                    .values(parked_ms=now - 2 * HOUR_MS, attempts=10)
                )
            elif state == "scheduled":
                session.execute(
                    update(outbox_events)
                    .where(rows)
                    .values(deliver_at_ms=now + 24 * HOUR_MS, created_ms=now - 2 * HOUR_MS)
                )
    engine.dispose()


def counts_by_state(url: str) -> dict[str, int]:
    engine = make_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(
            select(outbox_events.c.source, func.count()).group_by(outbox_events.c.source)
        ).all()
    engine.dispose()
    return {source.lstrip("/"): count for source, count in rows}


async def test_a_pass_deletes_only_published_rows_older_than_the_window(db_url: str) -> None:
    counts = {"pending": 4, "parked": 3, "scheduled": 3, "recent": 5, "old": 11}
    write_rows(db_url, counts)
    engine = make_async_engine(db_url)
    try:
        # Chunks of at most 2 rows: six transactions, ties of "old" across their borders.
        assert await delete_published(engine, retention_ms=HOUR_MS, chunk=2) == 11
        assert await delete_published(engine, retention_ms=HOUR_MS, chunk=2) == 0
    finally:
        await engine.dispose()
    kept = {state: n for state, n in counts.items() if state != "old"}
    assert counts_by_state(db_url) == kept


async def test_a_pass_gives_up_instead_of_queueing_behind_a_table_lock(pg_url: str) -> None:
    """A retention chunk waiting behind a long lock would make every writer of the outbox
    queue behind it: its lock timeout ends the pass instead, and the next pass deletes."""
    write_rows(pg_url, {"pending": 2, "parked": 0, "scheduled": 0, "recent": 0, "old": 6})
    engine = make_async_engine(pg_url)
    try:
        async with engine.connect() as holder:
            await holder.execute(text("LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE"))
            deleted = await asyncio.wait_for(
                delete_published(engine, retention_ms=HOUR_MS, chunk=100), scaled(10)
            )
            assert deleted == 0
            await holder.rollback()
        assert counts_by_state(pg_url) == {"pending": 2, "old": 6}
        assert await delete_published(engine, retention_ms=HOUR_MS, chunk=100) == 6
    finally:
        await engine.dispose()
    assert counts_by_state(pg_url) == {"pending": 2}


async def test_a_chunk_holds_no_lock_once_its_delete_returns(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunk's delete is one statement in autocommit: when its result reaches the client
    its transaction has ended, so no lock waits for the client's next round trip (a process
    descheduled before sending COMMIT would hold its row locks all that time)."""
    write_rows(pg_url, {"pending": 0, "parked": 0, "scheduled": 0, "recent": 0, "old": 6})
    engine = make_async_engine(pg_url)
    observer = make_engine(pg_url)
    locks_after_delete = locks_left_by_scripts(monkeypatch, observer, "DELETE")
    try:
        assert await delete_published(engine, retention_ms=HOUR_MS, chunk=100) == 6
    finally:
        await engine.dispose()
        observer.dispose()
    assert locks_after_delete == [0]


async def test_a_chunk_gives_up_behind_a_row_lock_within_its_lock_timeout(pg_url: str) -> None:
    """A published row locked by another transaction (nobody's usually): the chunk's delete
    waits for it no longer than its lock timeout, deletes nothing, and the pass ends; the next
    pass deletes every row."""
    write_rows(pg_url, {"pending": 0, "parked": 0, "scheduled": 0, "recent": 0, "old": 6})
    engine = make_async_engine(pg_url)
    old = select(outbox_events.c.id).where(outbox_events.c.source == "/old")
    try:
        async with engine.connect() as holder:
            await holder.execute(old.order_by(outbox_events.c.id.desc()).limit(1).with_for_update())
            deleted = await asyncio.wait_for(
                delete_published(engine, retention_ms=HOUR_MS, chunk=100), scaled(5)
            )
            assert deleted == 0
            await holder.rollback()
        assert counts_by_state(pg_url) == {"old": 6}
        assert await delete_published(engine, retention_ms=HOUR_MS, chunk=100) == 6
    finally:
        await engine.dispose()


async def test_a_chunk_skips_rows_another_transaction_holds_and_counts_what_it_deleted(
    pg_url: str,
) -> None:
    """With ``skip_locked`` a row locked by another transaction stays for the next pass, and
    the count is of the rows deleted, not of the ids the chunk read."""
    write_rows(pg_url, {"pending": 0, "parked": 0, "scheduled": 0, "recent": 0, "old": 6})
    engine = make_async_engine(pg_url)
    published = outbox_events.c.published_ms
    try:
        async with engine.connect() as holder:
            await holder.execute(
                select(outbox_events.c.id).order_by(outbox_events.c.id).limit(1).with_for_update()
            )
            deleted = await delete_in_chunks(
                async_sessionmaker(engine),
                outbox_events,
                lambda now: published < now - HOUR_MS,
                chunk_size=100,
                order_by=published,
                skip_locked=True,
            )
            assert deleted == 5
            await holder.rollback()
        assert counts_by_state(pg_url) == {"old": 1}
    finally:
        await engine.dispose()
