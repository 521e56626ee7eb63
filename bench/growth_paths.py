"""The hot paths bench.growth times on tables of growing size, through the real code.

- inbox: the consumer's optimistic chunk (``consumers.apply.Applier.run_optimistic``: one
  ``claim_many`` of the chunk's keys and the batch handler of ``bench.consumer_app`` writing one
  effect row per event, one transaction), fed in-memory Kafka records so the broker's own
  timing does not blur the database's;
- relay: ``Relay.drain()`` in poll mode publishing a backlog to a real broker; its batch times
  are read off ``relay.stats.published`` as it rises.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import ConsumerRecord
from outboxkit.consumers.apply import Applier
from outboxkit.consumers.metrics import ConsumerStats
from outboxkit.consumers.tracing import HandlerTelemetry
from outboxkit.outbox import new_event
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay, RelayOptions
from sqlalchemy.ext.asyncio import async_sessionmaker

from bench.common import bulk_fill, percentile, sample_events
from bench.consumer_app import EVENT_TYPE, make_app
from bench.growth_tables import CONSUMERS, SOURCES, uuid7_at
from tests.support.consumers import binary_record

INBOX_TOPIC = "growth-orders"
WARM_UP_BATCHES = 3


@dataclass
class Timing:
    """Throughput and per-batch latency of one measurement."""

    events: int
    seconds: float
    batch_ms: list[float]

    @classmethod
    def merged(cls, timings: list[Timing]) -> Timing:
        """One timing of several measurements."""
        return cls(
            sum(t.events for t in timings),
            sum(t.seconds for t in timings),
            [ms for t in timings for ms in t.batch_ms],
        )

    @property
    def per_s(self) -> float:
        """Events per second."""
        return self.events / self.seconds if self.seconds else 0.0

    @property
    def p99_ms(self) -> float:
        """99th percentile of the batch times."""
        return percentile(self.batch_ms, 99)

    @property
    def p50_ms(self) -> float:
        """Median batch time."""
        return percentile(self.batch_ms, 50)


def paired(
    empty: Callable[[], Timing], full: Callable[[], Timing], rounds: int
) -> tuple[Timing, Timing]:
    """Measure on the empty and on the full database in turn, ``rounds`` times each, so a
    change in the machine's load hits both sides alike."""
    on_empty, on_full = [], []
    for _ in range(rounds):
        on_empty.append(empty())
        on_full.append(full())
    return Timing.merged(on_empty), Timing.merged(on_full)


def inbox_records(count: int, offset: int) -> list[ConsumerRecord]:
    """``count`` Kafka records of fresh bench events (UUIDv7 ids of now) as the relay writes
    them, from one of the filled sources."""
    now = int(time.time() * 1000)
    records = []
    for n in range(count):
        event = new_event(
            EVENT_TYPE, SOURCES[n % len(SOURCES)], {"seq": offset + n}, id=uuid7_at(now)
        )
        key, value, headers = binary_record(event)
        records.append(
            ConsumerRecord(
                INBOX_TOPIC, 0, offset + n, now, 0, key, value, None, 0, len(value), headers
            )
        )
    return records


async def inbox_path(url: str, batches: int, batch_size: int) -> Timing:
    """Apply ``batches`` chunks of ``batch_size`` new events through the consumer's optimistic
    path (inbox claim + batch handler, one transaction each), after a short warm-up."""
    app = make_app(INBOX_TOPIC, name=CONSUMERS[0])
    engine = make_async_engine(url)
    stats = ConsumerStats()
    applier = Applier(
        app,
        async_sessionmaker(engine, expire_on_commit=False),
        HandlerTelemetry("growth", app.name),
        stats,
    )
    times: list[float] = []
    try:
        for n in range(WARM_UP_BATCHES + batches):
            records = inbox_records(batch_size, n * batch_size)
            steps = applier.steps(records)
            began = time.perf_counter()
            outcome = await applier.run_optimistic(records, steps, 0)
            elapsed = time.perf_counter() - began
            assert outcome.done == batch_size and outcome.failure is None, outcome
            if n >= WARM_UP_BATCHES:
                times.append(elapsed)
    finally:
        await engine.dispose()
    assert stats.applied == (WARM_UP_BATCHES + batches) * batch_size, stats
    return Timing(batches * batch_size, sum(times), [t * 1000 for t in times])


async def _drain_timed(relay: Relay, timeout_s: float) -> tuple[int, float, list[float]]:
    """Drain, sampling ``stats.published``: each rise is the end of one batch."""
    marks: list[float] = []
    task = asyncio.create_task(relay.drain(timeout_s=timeout_s))
    seen = relay.stats.published
    started = time.perf_counter()
    first = 0.0
    while not task.done():
        await asyncio.sleep(0.002)
        if relay.stats.published != seen:
            seen = relay.stats.published
            marks.append(time.perf_counter())
            first = first or marks[-1]
    published = await task
    ended = time.perf_counter()
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(marks)]
    # The clock runs from the first batch published: relay start-up (producer, leases) is not
    # what grows with the table.
    return published, ended - (first or started), gaps


async def relay_drain(url: str, bootstrap: str, topic: str, timeout_s: float) -> Timing:
    """Time ``Relay.drain()`` (poll mode, batches of 1,000, rows kept for retention)."""
    relay = Relay(
        db_url=url,
        kafka=KafkaSettings(bootstrap=bootstrap),
        options=RelayOptions(
            batch_size=1000, retention_s=7 * 24 * 3600, listen=False, cleanup_interval_s=1e9
        ),
    )
    published, seconds, gaps = await _drain_timed(relay, timeout_s)
    await relay.engine.dispose()
    return Timing(published, seconds, gaps)


def relay_path(url: str, bootstrap: str, events: int) -> Timing:
    """Write ``events`` pending events of ~1 KB, then time the relay publishing them."""
    topic = f"growth-relay-{uuid.uuid4().hex[:6]}"
    bulk_fill(url, topic, sample_events(events, 1000, 100))
    timing = asyncio.run(relay_drain(url, bootstrap, topic, timeout_s=600))
    assert timing.events == events, f"relay published {timing.events} of {events}"
    return timing
