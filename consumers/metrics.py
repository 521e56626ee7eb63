"""Prometheus metrics of the consumer runtime (served with ``outboxkit consume --metrics-port``).

Counters are read from the runtime's own :class:`~consumers.runtime.Stats` at scrape time, so
the hot path pays nothing for them; the handler duration is a histogram observed per call.
Labels hold the consumer name, event types and error classes only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from consumers.runtime import ConsumerRuntime

HANDLER_SECONDS = Histogram(
    "outboxkit_consumer_handler_seconds",
    "Handler duration per call, by event type.",
    ["event_type"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)

_COUNTERS = (
    ("outboxkit_consumer_processed", "Events whose effect committed.", "applied"),
    ("outboxkit_consumer_duplicates", "Redeliveries skipped by the inbox.", "duplicates"),
    ("outboxkit_consumer_retries", "Failed attempts that were retried.", "retries"),
)


class RuntimeCollector(Collector):
    """The counters of one :class:`ConsumerRuntime`, labelled with its consumer name."""

    def __init__(self, runtime: ConsumerRuntime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[CounterMetricFamily]:
        """One family per counter, read from the runtime's stats now."""
        name = self.runtime.app.name
        stats = self.runtime.stats
        for metric, help_text, field in _COUNTERS:
            family = CounterMetricFamily(metric, help_text, labels=["consumer"])
            family.add_metric([name], getattr(stats, field))
            yield family
        letters = CounterMetricFamily(
            "outboxkit_consumer_dead_lettered",
            "Records sent to the dead-letter topic, by error class.",
            labels=["consumer", "error_class"],
        )
        for error_class, count in sorted(stats.dead_lettered_by_class.items()):
            letters.add_metric([name, error_class], count)
        yield letters
