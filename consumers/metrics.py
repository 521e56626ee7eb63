"""Prometheus metrics of the consumer runtime (served with ``outboxkit consume --metrics-port``).

Counters are read from the runtime's own :class:`ConsumerStats` at scrape time, so the hot
path pays nothing for them; the handler duration is a histogram observed per call, and the
time from an event's ``time`` to the commit of its effect is observed per applied event once
its transaction committed (see :mod:`.tracing`). The lag per partition is computed at scrape
time from the consumer's high watermark and the runtime's :class:`Positions`. Labels hold the
consumer name, topics, partitions, event types and error classes only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalStateError
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from outboxkit.consumers.runtime import ConsumerRuntime

HANDLER_SECONDS = Histogram(
    "outboxkit_consumer_handler_seconds",
    "Handler duration per call, by event type.",
    ["event_type"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)

COMMIT_TO_EFFECT = Histogram(
    "outboxkit_consumer_commit_to_effect_seconds",
    "From the event's time to the commit of its effect (events without time: not observed).",
    ["consumer"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)

RETENTION_SKIPPED = Counter(
    "outboxkit_inbox_retention_skipped",
    "Inbox retention passes skipped: another consumer's pass held the maintainer's lock.",
    ["consumer"],
)

RETENTION_SKIPPED_IN_A_ROW = Gauge(
    "outboxkit_inbox_retention_skipped_in_a_row",
    "Inbox retention passes skipped since the last one that ran to its end.",
    ["consumer"],
)


@dataclass
class ConsumerStats:
    """Counters of one :class:`ConsumerRuntime` (``runtime.stats``), logged when it stops."""

    received: int = 0
    applied: int = 0
    duplicates: int = 0
    unhandled: int = 0
    dead_lettered: int = 0
    retries: int = 0
    dlq_failures: int = 0
    db_commits: int = 0
    offset_commits: int = 0
    held: int = 0
    released: int = 0
    dead_lettered_by_class: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


_COUNTERS = (
    ("outboxkit_consumer_processed", "Events whose effect committed.", "applied"),
    ("outboxkit_consumer_duplicates", "Redeliveries skipped by the inbox.", "duplicates"),
    ("outboxkit_consumer_retries", "Failed attempts that were retried.", "retries"),
)


class RuntimeCollector(Collector):
    """The counters of one :class:`ConsumerRuntime`, labelled with its consumer name."""

    def __init__(self, runtime: ConsumerRuntime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        """One family per counter, read from the runtime's stats now, and the lag gauge."""
        name = self.runtime.app.name
        stats = self.runtime.stats
        for metric, help_text, attribute in _COUNTERS:
            family = CounterMetricFamily(metric, help_text, labels=["consumer"])
            family.add_metric([name], getattr(stats, attribute))
            yield family
        letters = CounterMetricFamily(
            "outboxkit_consumer_dead_lettered",
            "Records sent to the dead-letter topic, by error class.",
            labels=["consumer", "error_class"],
        )
        for error_class, count in sorted(stats.dead_lettered_by_class.items()):
            letters.add_metric([name, error_class], count)
        yield letters
        lag = GaugeMetricFamily(
            "outboxkit_consumer_lag",
            "Records not handled yet: high watermark minus the next offset to handle.",
            labels=["consumer", "topic", "partition"],
        )
        for (topic, partition), value in sorted(self.runtime.positions.lags().items()):
            lag.add_metric([name, topic, str(partition)], value)
        yield lag
        stalled = GaugeMetricFamily(
            "outboxkit_consumer_stalled",
            "1 while an assigned partition lags with no offset committed for stall_after_s.",
            labels=["consumer"],
        )
        stalled.add_metric([name], int(self.runtime.stall.alarm.on))
        yield stalled
        quiet = GaugeMetricFamily(
            "outboxkit_consumer_uncommitted_lag_seconds",
            "Longest time a lagging partition has gone without a commit (past stall_after_s).",
            labels=["consumer"],
        )
        quiet.add_metric([name], self.runtime.stall.longest_s)
        yield quiet
        blocked = self.runtime.blocked_keys()
        if blocked is not None:  # only a consumer with on_dead_letter="sequence" handlers
            keys = GaugeMetricFamily(
                "outboxkit_consumer_blocked_keys",
                "Keys whose later records wait behind a dead-lettered head (sequence mode).",
                labels=["consumer"],
            )
            keys.add_metric([name], blocked[0])
            yield keys
            held = GaugeMetricFamily(
                "outboxkit_consumer_held_records",
                "Records held behind blocked keys, waiting to be applied in order.",
                labels=["consumer"],
            )
            held.add_metric([name], blocked[1])
            yield held


class Positions:
    """The next offset to handle per assigned partition, kept by the runtime for the lag gauge.

    aiokafka's ``position()`` is a coroutine and runs ahead of the handlers (it counts what was
    fetched), so the runtime records what it handled; the high watermark (sync) is read from
    the consumer at scrape time. Scrapes run in another thread: they only read.
    """

    def __init__(self) -> None:
        self.consumer: AIOKafkaConsumer | None = None
        self._next: dict[TopicPartition, int] = {}

    def handled(self, tp: TopicPartition, next_offset: int) -> None:
        """Everything of ``tp`` before ``next_offset`` was applied, skipped or dead-lettered."""
        self._next[tp] = next_offset

    async def fetched(
        self, consumer: AIOKafkaConsumer, batch: Mapping[TopicPartition, Sequence[ConsumerRecord]]
    ) -> None:
        """Learn where handling starts on partitions this runtime has not handled yet.

        The first record fetched after an assignment is at the committed offset. A partition
        that returned no record but has a high watermark has a valid position, which
        ``position()`` then returns without a network round trip.
        """
        assigned = consumer.assignment()
        for tp, records in batch.items():
            if records and tp in assigned and tp not in self._next:
                self._next[tp] = records[0].offset
        for tp in assigned - self._next.keys():
            # Each await below lets a rebalance run: a partition of ``assigned`` may be gone,
            # and aiokafka asserts on it (highwater) or raises (position).
            with contextlib.suppress(AssertionError, IllegalStateError, TimeoutError):
                if consumer.highwater(tp) is None:
                    continue
                self._next.setdefault(tp, await asyncio.wait_for(consumer.position(tp), 1.0))

    def revoked(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Forget ``partitions`` (all if ``None``): another member handles them now."""
        if partitions is None:
            self._next = {}
            return
        for tp in partitions:
            self._next.pop(tp, None)

    def lags(self) -> dict[tuple[str, int], int]:
        """High watermark minus the next offset to handle, per partition with both known."""
        consumer = self.consumer
        if consumer is None:
            return {}
        lags: dict[tuple[str, int], int] = {}
        for tp, next_offset in self._next.copy().items():
            try:
                highwater = consumer.highwater(tp)
            except (AssertionError, AttributeError, KeyError):  # revoked meanwhile
                continue
            if highwater is not None:
                lags[(tp.topic, tp.partition)] = max(0, highwater - next_offset)
        return lags
