"""Batch handlers: one call per run of new events, the same once-per-event guarantee, and
failures still isolated to the one event that causes them."""

from __future__ import annotations

import pytest
from aiokafka import TopicPartition
from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp, HandlerSignatureError
from outboxkit.outbox import PermanentError, TransientError
from outboxkit.testing.kafka import create_topic
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from tests.support.consumer_apps import WIDGET_TYPE, Widget, consumer_effects
from tests.support.consumers import (
    FAST_RETRY,
    alive,
    binary_record,
    committed_offsets,
    create_effects_table,
    effect_rows,
    produce,
    running,
    widget,
)
from tests.support.kafka import read_topic, wait_for


def batch_app(
    topic: str, fail: dict[int, list[BaseException]], calls: list[list[int]]
) -> ConsumerApp:
    """Writes all rows of a batch in one statement, then raises the next error queued for any
    widget of the batch (after the write, so a failed call must roll the whole batch back)."""
    app = ConsumerApp(name="ledger", retry=FAST_RETRY, retention_interval_s=None)

    @app.batch_handler(WIDGET_TYPE, topic=topic)
    async def record(
        widgets: list[Widget], events: list[CloudEvent], session: AsyncSession
    ) -> None:
        calls.append([w.n for w in widgets])
        rows = [
            {
                "consumer": "ledger",
                "source": e.get_source(),
                "event_id": e.get_id(),
                "n": w.n,
                "pid": 0,
            }
            for w, e in zip(widgets, events, strict=True)
        ]
        await session.execute(insert(consumer_effects), rows)
        for w in widgets:
            if fail.get(w.n):
                raise fail[w.n].pop(0)

    return app


async def test_a_batch_handler_applies_each_event_once_in_order_with_few_calls(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    # 300 events, then the first 100 again (a relay retry, say): duplicates the inbox skips.
    records = [binary_record(widget(n)) for n in range(300)] + [
        binary_record(widget(n)) for n in range(100)
    ]
    await produce(kafka_bootstrap, topic, records)
    calls: list[list[int]] = []
    async with running(batch_app(topic, {}, calls), pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied + runtime.stats.duplicates,
            lambda n: n >= 400,
            60,
            "400 records handled",
        )
    assert [row.n for row in effect_rows(pg_url)] == list(range(300))
    assert runtime.stats.duplicates == 100
    assert len(calls) < 30, f"{len(calls)} handler calls for 300 events: not batched"
    assert [n for call in calls for n in call] == list(range(300))
    assert await committed_offsets(kafka_bootstrap, runtime.group) == {
        TopicPartition(topic, 0): 400
    }


async def test_one_bad_event_in_a_batch_is_dead_lettered_and_the_rest_applied_once(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    await produce(kafka_bootstrap, topic, [binary_record(widget(n)) for n in range(50)])
    fail: dict[int, list[BaseException]] = {
        17: [PermanentError("widget 17 refused")] * 3,  # in the batch call, then on its own
        30: [TransientError("ledger busy")],  # passes on its second attempt
    }
    calls: list[list[int]] = []
    async with running(batch_app(topic, fail, calls), pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied + runtime.stats.dead_lettered,
            lambda n: n >= 50,
            60,
            "50 records handled",
        )
    assert [row.n for row in effect_rows(pg_url)] == [n for n in range(50) if n != 17]
    assert runtime.stats.dead_lettered == 1 and runtime.stats.retries == 1
    letters = await read_topic(kafka_bootstrap, f"{topic}.dlq", 1)
    assert [dict(r.headers)["ce_id"] for r in letters] == [b"w-17"]
    assert [17] in calls  # the culprit was found by calling it on its own
    assert await committed_offsets(kafka_bootstrap, runtime.group) == {TopicPartition(topic, 0): 50}


def test_batch_handlers_are_async_and_take_lists() -> None:
    app = ConsumerApp(name="ledger")
    with pytest.raises(HandlerSignatureError, match="must be async"):

        @app.batch_handler(WIDGET_TYPE, topic="t")
        def sync_batch(widgets: list[Widget], session: Session) -> None: ...

    with pytest.raises(HandlerSignatureError, match="takes list"):

        @app.batch_handler(WIDGET_TYPE, topic="t")
        async def not_a_list(widget: Widget, session: AsyncSession) -> None: ...
