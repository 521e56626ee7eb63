"""Reading topics back from the real broker in tests, waiting on a condition with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRecord
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.testing.kafka import KafkaBroker

from tests.support.waits import scaled

T = TypeVar("T")


@contextlib.contextmanager
def broker_of_its_own() -> Iterator[KafkaBroker]:
    """A started broker for tests that stop and restart it; closed (data deleted) after."""
    broker = KafkaBroker()
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


async def read_topic(
    bootstrap: str | KafkaSettings, topic: str, expected: int, timeout: float = 60.0
) -> list[ConsumerRecord]:
    """Read ``topic`` from the beginning until ``expected`` records or the deadline.

    It keeps reading a little after reaching ``expected`` so that extra records (duplicates)
    that are already in the topic are seen too. ``timeout`` is a quiet machine's figure,
    :func:`~tests.support.waits.scaled` for the load.
    """
    kafka = (
        bootstrap if isinstance(bootstrap, KafkaSettings) else KafkaSettings(bootstrap=bootstrap)
    )
    consumer = AIOKafkaConsumer(
        topic,
        **kafka.client_options("outboxkit-tests"),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + scaled(timeout)
    try:
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            fetched = [r for rs in batch.values() for r in rs]
            records.extend(fetched)
            if len(records) >= expected and not fetched:
                break
    finally:
        await consumer.stop()
    return records


async def wait_for(
    probe: Callable[[], T], done: Callable[[T], bool], timeout: float, what: str
) -> T:
    """Call ``probe`` (sync or async) until ``done(result)`` or fail after ``timeout`` seconds
    (a quiet machine's figure, :func:`~tests.support.waits.scaled` for the load)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if asyncio.iscoroutine(result):
            result = await result
        if done(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {result}")
        await asyncio.sleep(0.1)
