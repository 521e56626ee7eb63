"""The inbox: each event's effect applied once per consumer, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import threading

from cloudevents.core.bindings.kafka import to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp, inbox_events, purge_inbox
from outboxkit.consumers.inbox import claim_many
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.tables import outbox_events
from outboxkit.testing.kafka import create_topic
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from tests.support.consumer_apps import WIDGET_TYPE, Widget, consumer_effects
from tests.support.consumers import (
    alive,
    binary_record,
    count_rows,
    create_effects_table,
    effect_rows,
    effects_app_for,
    produce,
    produce_events,
    running,
)
from tests.support.kafka import wait_for

DAY_MS = 86_400_000


async def test_duplicate_is_applied_once_and_same_id_from_another_source_is_new(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(db_url)
    await create_topic(kafka_bootstrap, topic)
    first = new_event(WIDGET_TYPE, "/shop/a", {"n": 1}, id="evt-1")
    same_id_other_source = new_event(WIDGET_TYPE, "/shop/b", {"n": 2}, id="evt-1")
    unhandled = new_event("gadget.created", "/shop/a", {"n": 3})  # skipped by default
    # A duplicate inside one fetched batch, then a redelivery in a later batch.
    await produce_events(kafka_bootstrap, topic, [first, first, unhandled, same_id_other_source])
    async with running(effects_app_for(topic), db_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied + runtime.stats.duplicates,
            lambda seen: seen >= 3,
            60,
            "the first four records",
        )
        await produce_events(kafka_bootstrap, topic, [first])
        await wait_for(
            lambda: alive(task) or runtime.stats.duplicates, lambda d: d >= 2, 60, "redelivery"
        )
    rows = effect_rows(db_url)
    assert sorted((r.source, r.event_id, r.n) for r in rows) == [
        ("/shop/a", "evt-1", 1),
        ("/shop/b", "evt-1", 2),
    ]
    assert count_rows(db_url, inbox_events) == 2
    assert runtime.stats.applied == 2 and runtime.stats.duplicates == 2
    assert runtime.stats.unhandled == 1 and runtime.stats.dead_lettered == 0


async def test_structured_mode_is_chosen_by_content_type_not_by_ce_headers(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    event = CloudEvent(
        {
            "type": WIDGET_TYPE,
            "source": "/structured",
            "id": "body-id",
            "datacontenttype": "application/json",
        },
        {"n": 7},
    )
    message = to_structured(event, JSONFormat())
    # A stray ce_ header must not switch decoding to binary mode (the SDK's from_kafka would).
    headers = [(k, v) for k, v in message.headers.items()] + [("ce_id", b"header-id")]
    structured = (None, message.value, headers)
    await produce(
        kafka_bootstrap,
        topic,
        [structured, binary_record(new_event(WIDGET_TYPE, "/binary", {"n": 8}, id="b-1"))],
    )
    async with running(effects_app_for(topic), pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied, lambda n: n >= 2, 60, "2 effects"
        )
    rows = effect_rows(pg_url)
    assert [(r.source, r.event_id, r.n) for r in rows] == [
        ("/structured", "body-id", 7),
        ("/binary", "b-1", 8),
    ]


async def test_sync_handlers_get_a_sync_session_or_run_in_a_thread(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(db_url)
    await create_topic(kafka_bootstrap, topic)
    app = ConsumerApp(name="sync", retention_interval_s=None)
    in_worker_thread: list[bool] = []

    @app.handler(WIDGET_TYPE, topic=topic)
    def with_session(widget: Widget, event: CloudEvent, session: Session) -> None:
        session.execute(
            insert(consumer_effects).values(
                consumer="sync",
                source=event.get_source(),
                event_id=event.get_id(),
                n=widget.n,
                pid=0,
            )
        )

    @app.handler("widget.seen", topic=topic)
    def without_session(widget: Widget) -> None:
        in_worker_thread.append(threading.current_thread() is not threading.main_thread())

    events = [new_event(WIDGET_TYPE, "/s", {"n": 5}), new_event("widget.seen", "/s", {"n": 6})]
    await produce_events(kafka_bootstrap, topic, events)
    async with running(app, db_url, kafka_bootstrap) as (runtime, task):
        await wait_for(lambda: alive(task) or runtime.stats.applied, lambda n: n >= 2, 60, "both")
    assert [row.n for row in effect_rows(db_url)] == [5]
    assert in_worker_thread == [True]


async def test_handler_output_through_outbox_is_not_repeated_for_a_duplicate_input(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await create_topic(kafka_bootstrap, topic)
    outbox = Outbox(default_topic="invoices")
    app = ConsumerApp(name="invoicing", retention_interval_s=None)

    @app.handler("order.placed", topic=topic)
    async def invoice(event: CloudEvent, session: AsyncSession) -> None:
        # A fresh random id: only the inbox can keep a duplicate input from a second output.
        output = new_event("invoice.created", "/invoicing", {"order": event.get_id()})
        await outbox.add_async(session, output)

    order = new_event("order.placed", "/shop", {"total": 10}, id="order-1")
    await produce_events(kafka_bootstrap, topic, [order])
    async with running(app, db_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied, lambda n: n >= 1, 60, "applied"
        )
        await produce_events(kafka_bootstrap, topic, [order])
        await wait_for(lambda: alive(task) or runtime.stats.duplicates, lambda n: n >= 1, 60, "dup")
    engine = make_engine(db_url, poolclass=NullPool)
    with engine.connect() as connection:
        rows = connection.execute(select(outbox_events.c.type, outbox_events.c.payload)).all()
    engine.dispose()
    assert [(r.type, json.loads(r.payload)) for r in rows] == [
        ("invoice.created", {"order": "order-1"})
    ]


async def test_claim_many_returns_exactly_the_keys_no_claim_had_before(db_url: str) -> None:
    """More keys than one claim statement takes, some claimed before (by this consumer or
    another), some given twice: the new ones come back, each claimed once."""
    engine = make_async_engine(db_url)
    keys = [("/s", f"e-{i}") for i in range(1_200)] + [("/t", "e-1")]
    before = keys[::7]
    async with engine.begin() as connection:
        await connection.execute(
            insert(inbox_events),
            [{"consumer": "c1", "source": s, "event_id": e, "processed_ms": 1} for s, e in before]
            + [{"consumer": "c2", "source": "/s", "event_id": "e-1", "processed_ms": 1}],
        )
    async with AsyncSession(engine) as session, session.begin():
        fresh = await claim_many(session, "c1", [*keys, keys[1], keys[-1], before[3]])
        assert await claim_many(session, "c1", []) == set()
    assert fresh == set(keys) - set(before)
    async with engine.connect() as connection:
        claimed = (
            await connection.execute(
                select(inbox_events.c.source, inbox_events.c.event_id).where(
                    inbox_events.c.consumer == "c1"
                )
            )
        ).all()
    assert sorted(claimed) == sorted(keys)
    async with AsyncSession(engine) as session, session.begin():
        assert await claim_many(session, "c1", keys) == set()  # all of them claimed now
    await engine.dispose()


async def test_purge_removes_old_entries_in_chunks(db_url: str) -> None:
    engine = make_async_engine(db_url)
    async with engine.begin() as connection:
        now = await connection.scalar(select(_now_ms(connection.dialect.name)))
        rows = [
            {
                "consumer": "c1",
                "source": "/s",
                "event_id": f"old-{i}",
                "processed_ms": now - 8 * DAY_MS,
            }
            for i in range(5)
        ]
        rows += [
            {"consumer": "c1", "source": "/s", "event_id": f"new-{i}", "processed_ms": now - DAY_MS}
            for i in range(2)
        ]
        rows += [
            {
                "consumer": "c2",
                "source": "/s",
                "event_id": f"old-{i}",
                "processed_ms": now - 9 * DAY_MS,
            }
            for i in range(3)
        ]
        await connection.execute(insert(inbox_events), rows)
    assert await purge_inbox(engine, consumer="c1", chunk_size=2) == 5
    async with engine.connect() as connection:
        left = (
            await connection.execute(select(inbox_events.c.consumer, inbox_events.c.event_id))
        ).all()
    assert sorted(left) == [
        ("c1", "new-0"),
        ("c1", "new-1"),
        ("c2", "old-0"),
        ("c2", "old-1"),
        ("c2", "old-2"),
    ]
    assert await purge_inbox(engine, older_than_s=3600) == 5
    await engine.dispose()


async def test_runtime_purges_the_inbox_periodically(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    engine = make_engine(pg_url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.execute(
            insert(inbox_events).values(
                consumer="billing", source="/s", event_id="ancient", processed_ms=0
            )
        )
    engine.dispose()
    app = effects_app_for(topic)
    app.retention_interval_s = 0.2
    async with running(app, pg_url, kafka_bootstrap) as (_, task):
        # In a thread: the runtime's retention, in this event loop, holds the partition locks
        # a count waits for (a blocking count here would wait for them forever).
        await wait_for(
            lambda: alive(task) or asyncio.to_thread(count_rows, pg_url, inbox_events),
            lambda n: n == 0,
            60,
            "purge",
        )


def _now_ms(dialect_name: str):  # type: ignore[no-untyped-def]
    from outboxkit.outbox.clock import db_now_ms

    return db_now_ms(dialect_name)
