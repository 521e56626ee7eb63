"""The outbox's retention pass deletes published rows older than the window, and nothing else."""

from __future__ import annotations

import asyncio

from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay.retention import delete_published
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

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
