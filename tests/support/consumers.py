"""Helpers of the consumer tests: topics, input records, effect counts, a runtime in a task."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupCoordinatorNotAvailableError
from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp, ConsumerRuntime, dlq_headers
from outboxkit.outbox import RetryPolicy, encode_binary, new_event
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.testing.kafka import create_topic
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.pool import NullPool

from tests.support.consumer_apps import WIDGET_TYPE, Widget, consumer_effects, effects_metadata
from tests.support.waits import scaled

Header = tuple[str, bytes | None]
RawRecord = tuple[bytes | None, bytes | None, Sequence[Header]]  # key, value, headers

# Retries fast enough for tests: three attempts within a fraction of a second.
FAST_RETRY = RetryPolicy(max_attempts=3, backoff=Backoff(base_s=0.01, cap_s=0.05), max_elapsed_s=30)


def effects_app_for(topic: str, name: str = "billing", **options: object) -> ConsumerApp:
    """An app on ``topic`` whose handler writes one ``consumer_effects`` row per application."""
    app = ConsumerApp(name=name, retention_interval_s=None, **options)  # type: ignore[arg-type]

    @app.handler(WIDGET_TYPE, topic=topic)
    async def record(item: Widget, event: CloudEvent, session: AsyncSession) -> None:
        await session.execute(
            insert(consumer_effects).values(
                consumer=name, source=event.get_source(), event_id=event.get_id(), n=item.n, pid=0
            )
        )

    return app


def widget(n: int) -> CloudEvent:
    """Widget ``n`` as an event with a deterministic id, all on one partition key."""
    return new_event(WIDGET_TYPE, "/widgets", {"n": n}, id=f"w-{n}", partitionkey="k")


async def committed_offsets(bootstrap: str, group: str) -> dict[TopicPartition, int]:
    """The group's committed offsets (partitions without one are absent).

    None yet while the group's coordinator is being set up: on a fresh broker the first group
    waits for ``__consumer_offsets`` to be created, and a probe must wait through that.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    except GroupCoordinatorNotAvailableError:
        return {}
    finally:
        await admin.close()
    return {tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}


def binary_record(event: CloudEvent) -> RawRecord:
    """The Kafka record the relay would publish for ``event`` (binary content mode)."""
    encoded = encode_binary(event)
    headers = [(name, value.encode("utf-8")) for name, value in encoded.headers.items()]
    return encoded.key, encoded.payload, headers


def dead_letter_records(
    topic: str, cause: str, ns: Iterable[int], data: dict[str, Any] | None = None
) -> list[RawRecord]:
    """Dead letters of ``order.placed`` events ``o-N`` (data ``{"n": N, **data}``) from
    ``topic``'s partition 0 at offset N, failed with ``cause`` (``category:Class``) by
    ``shipping``, as the consumer runtime writes them."""
    records = []
    for n in ns:
        key, value, headers = binary_record(
            new_event("order.placed", "/shop", {"n": n, **(data or {})}, id=f"o-{n}")
        )
        letter = dlq_headers.DeadLetter(
            topic=topic, partition=0, offset=n, timestamp=None, key=key, value=value,
            headers=headers, error_class=cause, error_message=f"order {n} exceeds the limit",
            attempts=3, first_failure_ms=None, last_failure_ms=None,
        )  # fmt: skip
        records.append((key, value, letter.to_headers("shipping")))
    return records


async def dead_letters_of_two_causes(
    bootstrap: str, topic: str, data: dict[str, Any] | None = None
) -> str:
    """Create ``topic`` and ``topic.dlq`` (the name returned), and fill the latter with a group
    of 4 letters of one cause (``permanent:Limit``, orders 0-3) and 2 of another
    (``exhausted:Timeout``, orders 10 and 11)."""
    dlq = f"{topic}.dlq"
    await create_topic(bootstrap, topic)
    await create_topic(bootstrap, dlq)
    await produce(bootstrap, dlq, dead_letter_records(topic, "permanent:Limit", range(4), data))
    await produce(
        bootstrap, dlq, dead_letter_records(topic, "exhausted:Timeout", range(10, 12), data)
    )
    return dlq


async def produce(
    bootstrap: str | KafkaSettings,
    topic: str,
    records: Iterable[RawRecord],
    partition: int | None = None,
) -> None:
    """Send raw records to ``topic`` and wait until the broker has them all."""
    kafka = (
        bootstrap if isinstance(bootstrap, KafkaSettings) else KafkaSettings(bootstrap=bootstrap)
    )
    producer = AIOKafkaProducer(**kafka.client_options("outboxkit-tests"), enable_idempotence=True)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=key, headers=list(headers), partition=partition)
            for key, value, headers in records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def produce_events(bootstrap: str, topic: str, events: Iterable[CloudEvent]) -> None:
    """Send ``events`` in binary mode, as the relay would."""
    await produce(bootstrap, topic, [binary_record(event) for event in events])


def create_effects_table(db_url: str) -> None:
    """Create ``consumer_effects`` (the handlers' business table) in the test database."""
    engine = make_engine(db_url, poolclass=NullPool)
    effects_metadata.create_all(engine)
    engine.dispose()


def effect_rows(db_url: str) -> list[Any]:
    """All rows of ``consumer_effects``, in insertion order."""
    engine = make_engine(db_url, poolclass=NullPool)
    with engine.connect() as connection:
        rows = connection.execute(select(consumer_effects).order_by(consumer_effects.c.id)).all()
    engine.dispose()
    return list(rows)


def count_rows(db_url: str, table: Any) -> int:
    """The number of rows in ``table``."""
    engine = make_engine(db_url, poolclass=NullPool)
    with engine.connect() as connection:
        count = connection.scalar(select(func.count()).select_from(table))
    engine.dispose()
    return int(count or 0)


@contextlib.asynccontextmanager
async def running(
    app: ConsumerApp, db_url: str, bootstrap: str, **options: Any
) -> AsyncIterator[tuple[ConsumerRuntime, asyncio.Task[Any]]]:
    """Run ``app`` in a task of this event loop; stop it (and wait for it) on exit.

    Each run gets a consumer group of its own (``runtime.group``) unless ``group`` is given.
    """
    options.setdefault("group", f"{app.group_id}-{uuid.uuid4().hex[:8]}")
    runtime = ConsumerRuntime(
        app, kafka=KafkaSettings(bootstrap=bootstrap), db_url=db_url, **options
    )
    task = asyncio.create_task(runtime.run())
    try:
        yield runtime, task
    finally:
        await asyncio.wait_for(runtime.stop(), scaled(60))
        await asyncio.wait_for(task, scaled(60))


def alive(task: asyncio.Task[Any]) -> None:
    """Raise the runtime's own error if its task ended, instead of waiting for a deadline."""
    if task.done():
        task.result()
        raise AssertionError("the consumer runtime stopped on its own")
