"""Writing events in the caller's transaction, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from outboxkit.outbox import InvalidEventError, Outbox, new_event
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.tables import outbox_events
from pydantic import BaseModel
from sqlalchemy import Column, Integer, MetaData, String, Table, func, select
from sqlalchemy.orm import Session

orders_metadata = MetaData()
orders = Table(
    "orders",
    orders_metadata,
    Column("id", Integer, primary_key=True),
    Column("customer", String(50), nullable=False),
)


class OrderPlaced(BaseModel):
    order_id: int
    customer: str


def count_rows(url: str, table: Table) -> int:
    engine = make_engine(url)
    with engine.connect() as connection:
        count = connection.scalar(select(func.count()).select_from(table))
    engine.dispose()
    return count


def test_commit_writes_change_and_event_rollback_writes_neither(db_url: str) -> None:
    engine = make_engine(db_url)
    orders_metadata.create_all(engine)
    outbox = Outbox(topics={"order.placed": "orders"})
    with Session(engine) as session, session.begin():
        session.execute(orders.insert().values(id=1, customer="ada"))
        event = new_event("order.placed", "/shop", OrderPlaced(order_id=1, customer="ada"))
        assert outbox.add(session, event) is True
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        session.execute(orders.insert().values(id=2, customer="bob"))
        outbox.add(session, new_event("order.placed", "/shop", {"order_id": 2}))
        raise RuntimeError("business rule failed")
    engine.dispose()
    assert count_rows(db_url, orders) == 1
    assert count_rows(db_url, outbox_events) == 1
    engine = make_engine(db_url)
    with engine.connect() as connection:
        row = connection.execute(select(outbox_events)).one()
    engine.dispose()
    assert row.topic == "orders"
    assert json.loads(row.payload) == {"order_id": 1, "customer": "ada"}
    headers = json.loads(row.headers)
    assert headers["ce_type"] == "order.placed"
    assert headers["content-type"] == "application/json"


async def test_async_session_writes_in_callers_transaction(db_url: str) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    engine = make_async_engine(db_url)
    outbox = Outbox(default_topic="events")
    async with AsyncSession(engine) as session, session.begin():
        assert await outbox.add_async(session, new_event("a.b", "/src", {"n": 1})) is True
    async with AsyncSession(engine) as session:
        await session.begin()
        await outbox.add_async(session, new_event("a.b", "/src", {"n": 2}))
        await session.rollback()
    await engine.dispose()
    assert count_rows(db_url, outbox_events) == 1


async def test_add_all_async_writes_in_order_skips_duplicates_and_rolls_back(db_url: str) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    engine = make_async_engine(db_url)
    outbox = Outbox(default_topic="events")
    first = [new_event("a.b", "/src", {"n": n}, id=f"e-{n}", partitionkey="k") for n in range(3)]
    async with AsyncSession(engine) as session, session.begin():
        assert await outbox.add_all_async(session, first) == 3
    again = [first[1], new_event("a.b", "/src", {"n": 3}, id="e-3", partitionkey="k")]
    async with AsyncSession(engine) as session, session.begin():
        assert await outbox.add_all_async(session, again) == 1  # e-1 is still in the table
    async with AsyncSession(engine) as session:
        await session.begin()
        await outbox.add_all_async(session, [new_event("a.b", "/src", {"n": 4}, id="e-4")])
        await session.rollback()
    async with AsyncSession(engine) as session:
        ids = (
            await session.execute(select(outbox_events.c.event_id).order_by(outbox_events.c.id))
        ).scalars()
        assert list(ids) == ["e-0", "e-1", "e-2", "e-3"]
    await engine.dispose()


def test_same_source_and_id_is_a_no_op_other_source_is_new(db_url: str) -> None:
    engine = make_engine(db_url)
    outbox = Outbox(default_topic="events")
    with Session(engine) as session, session.begin():
        assert outbox.add(session, new_event("a.b", "/one", {"v": 1}, id="fixed-1")) is True
    with Session(engine) as session, session.begin():
        assert outbox.add(session, new_event("a.b", "/one", {"v": 2}, id="fixed-1")) is False
        assert outbox.add(session, new_event("a.b", "/two", {"v": 1}, id="fixed-1")) is True
    engine.dispose()
    assert count_rows(db_url, outbox_events) == 2


def test_wrong_session_kind_is_refused(sqlite_url: str) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    engine = make_async_engine(sqlite_url)
    with pytest.raises(TypeError, match="add_async"):
        Outbox(default_topic="t").add(AsyncSession(engine), new_event("a", "/s"))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: new_event("", "/s"), "'type' is required"),
        (lambda: new_event("a", ""), "'source' is required"),
        (lambda: new_event("a", "/s", extensions={"Bad-Name": "x"}), "extension name"),
        (lambda: new_event("a", "/s", extensions={"data": "x"}), "clashes"),
    ],
)
def test_bad_events_fail_when_built(build, message: str) -> None:
    with pytest.raises(InvalidEventError, match=message):
        build()


def test_bad_data_or_topic_fails_before_commit(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    with Session(engine) as session, session.begin():
        with pytest.raises(InvalidEventError, match="not JSON-serialisable"):
            Outbox(default_topic="t").add(session, new_event("a", "/s", {"x": object()}))
        with pytest.raises(InvalidEventError, match="no topic"):
            Outbox().add(session, new_event("a", "/s", {"x": 1}))
        with pytest.raises(InvalidEventError, match="invalid Kafka topic"):
            Outbox().add(session, new_event("a", "/s"), topic="bad topic!")
    engine.dispose()
    assert count_rows(sqlite_url, outbox_events) == 0
