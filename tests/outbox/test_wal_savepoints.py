"""WAL messages under savepoints and abandoned sessions, published by a logical relay: real
PostgreSQL and Kafka.

The invariants of the writer: an event added outside a rolled-back savepoint is published,
one added inside it never is; a rolled-back or abandoned transaction never publishes.
"""

from __future__ import annotations

import gc
import json

import pytest
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine, make_engine
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from tests.relay.test_logical import make_slot, relay_for
from tests.support.kafka import read_topic
from tests.support.waits import scaled

# A plan: "+X" adds the event X, "[" opens a savepoint, "]" releases it, "!" rolls it back.
PLANS = {
    "rolled-back": "+A [ +B ! +C",
    "released": "+A [ +B ] +C",
    "empty-rolled-back": "+A [ ! +B",
    "first-add-inside": "[ +A ! +B",
    "inner-rolled-back": "+A [ +B [ +C ! +D ] +E",
    "outer-rolled-back": "+A [ +B [ +C ] ! +D",
    "two-in-turn": "+A [ +B ! [ +C ] +D [ +E !",
}
OUTBOXES = {
    "at-commit": {"wal_messages": True, "emit_at_commit": True},
    "at-once": {"wal_messages": True},
}


def survivors(plan: str) -> list[str]:
    """The events of ``plan`` that a commit of the whole transaction publishes, in add order."""
    levels: list[list[str]] = [[]]
    for step in plan.split():
        if step == "[":
            levels.append([])
        elif step == "]":
            inner = levels.pop()
            levels[-1] += inner
        elif step == "!":
            levels.pop()
        else:
            levels[-1].append(step[1:])
    assert len(levels) == 1, f"unbalanced plan {plan!r}"
    return levels[0]


def event(label: str):  # type: ignore[no-untyped-def]
    return new_event("label", "/savepoints", {"label": label}, partitionkey="one-key")


def run_plan(session: Session, outbox: Outbox, plan: str) -> None:
    """Play ``plan`` in the session's open transaction (savepoints by ``begin_nested``)."""
    savepoints = []
    for step in plan.split():
        if step == "[":
            savepoints.append(session.begin_nested())
        elif step == "]":
            savepoints.pop().commit()
        elif step == "!":
            savepoints.pop().rollback()
        else:
            outbox.add(session, event(step[1:]))


async def run_plan_async(session: AsyncSession, outbox: Outbox, plan: str) -> None:
    """:func:`run_plan` on an ``AsyncSession`` (``add_async``)."""
    savepoints = []
    for step in plan.split():
        if step == "[":
            savepoints.append(await session.begin_nested())
        elif step == "]":
            await savepoints.pop().commit()
        elif step == "!":
            await savepoints.pop().rollback()
        else:
            await outbox.add_async(session, event(step[1:]))


async def published(pg_url: str, kafka_bootstrap: str, topic: str, expected: int) -> list[str]:
    """Drain the slot and return the labels on ``topic`` in Kafka order (``expected`` of
    them, or more if more were published)."""
    sent = await relay_for(pg_url, kafka_bootstrap).drain(timeout_s=scaled(60))
    records = await read_topic(kafka_bootstrap, topic, expected=max(sent, expected))
    return [json.loads(record.value)["label"] for record in records]


def test_the_plans_mean_what_they_say() -> None:
    assert survivors(PLANS["rolled-back"]) == ["A", "C"]
    assert survivors(PLANS["inner-rolled-back"]) == ["A", "B", "D", "E"]
    assert survivors(PLANS["outer-rolled-back"]) == ["A", "D"]
    assert survivors(PLANS["two-in-turn"]) == ["A", "C", "D"]


@pytest.mark.parametrize("kind", sorted(OUTBOXES))
async def test_a_savepoint_keeps_the_events_before_it_and_drops_its_own_sync(
    pg_url: str, kafka_bootstrap: str, topic: str, kind: str
) -> None:
    await make_slot(pg_url, kafka_bootstrap)
    outbox = Outbox(default_topic=topic, **OUTBOXES[kind])
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)
    expected: list[str] = []
    for name, plan in PLANS.items():
        tagged = " ".join(f"+{name}:{s[1:]}" if s.startswith("+") else s for s in plan.split())
        with Session(engine) as session, session.begin():
            run_plan(session, outbox, tagged)
        expected += survivors(tagged)
    engine.dispose()
    assert await published(pg_url, kafka_bootstrap, topic, len(expected)) == expected


@pytest.mark.parametrize("kind", sorted(OUTBOXES))
async def test_a_savepoint_keeps_the_events_before_it_and_drops_its_own_async(
    pg_url: str, kafka_bootstrap: str, topic: str, kind: str
) -> None:
    await make_slot(pg_url, kafka_bootstrap)
    outbox = Outbox(default_topic=topic, **OUTBOXES[kind])
    engine = make_async_engine(pg_url)
    expected: list[str] = []
    for name, plan in PLANS.items():
        tagged = " ".join(f"+{name}:{s[1:]}" if s.startswith("+") else s for s in plan.split())
        async with AsyncSession(engine) as session, session.begin():
            await run_plan_async(session, outbox, tagged)
        expected += survivors(tagged)
    await engine.dispose()
    assert await published(pg_url, kafka_bootstrap, topic, len(expected)) == expected


async def test_a_savepoint_begun_on_the_connection_itself_drops_its_own_events(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await make_slot(pg_url, kafka_bootstrap)
    outbox = Outbox(default_topic=topic, wal_messages=True, emit_at_commit=True)
    engine = make_engine(pg_url)
    with Session(engine) as session, session.begin():
        outbox.add(session, event("before"))
        savepoint = session.connection().begin_nested()  # the session does not know of it
        outbox.add(session, event("inside"))
        savepoint.rollback()
        outbox.add(session, event("after"))
    engine.dispose()
    assert await published(pg_url, kafka_bootstrap, topic, 2) == ["before", "after"]


@pytest.mark.parametrize("kind", sorted(OUTBOXES))
async def test_an_abandoned_session_never_publishes_on_the_reused_connection(
    pg_url: str, kafka_bootstrap: str, topic: str, kind: str
) -> None:
    await make_slot(pg_url, kafka_bootstrap)
    outbox = Outbox(default_topic=topic, **OUTBOXES[kind])
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)  # the next session reuses it
    session = Session(engine)
    outbox.add(session, event("abandoned-1"))
    outbox.add(session, event("abandoned-2"))
    del session  # dropped: no commit, no rollback, no close
    gc.collect()
    with Session(engine) as session, session.begin():  # a commit with no event of its own
        session.execute(text("SELECT 1"))
    with Session(engine) as session, session.begin():
        outbox.add(session, event("committed"))
    session = Session(engine)
    with session.begin():
        outbox.add(session, event("rolled-back"))
        session.rollback()
    session = Session(engine)  # dropped inside a savepoint
    session.begin()
    outbox.add(session, event("abandoned-3"))
    session.begin_nested()
    outbox.add(session, event("abandoned-4"))
    del session
    gc.collect()
    with Session(engine) as session, session.begin():
        outbox.add(session, event("last"))
    assert engine.pool.checkedout() == 0 and engine.pool.size() == 1
    engine.dispose()
    assert await published(pg_url, kafka_bootstrap, topic, 2) == ["committed", "last"]


async def test_an_abandoned_async_session_never_publishes(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await make_slot(pg_url, kafka_bootstrap)
    outbox = Outbox(default_topic=topic, wal_messages=True, emit_at_commit=True)
    engine = make_async_engine(pg_url, pool_size=1, max_overflow=0)
    session = AsyncSession(engine)
    await outbox.add_async(session, event("abandoned-1"))
    del session  # the pool cannot roll an asyncio connection back from the collector
    with pytest.warns(Warning, match="garbage collector"):
        gc.collect()
    async with AsyncSession(engine) as session, session.begin():
        await outbox.add_async(session, event("committed"))
    await engine.dispose()
    assert await published(pg_url, kafka_bootstrap, topic, 1) == ["committed"]
