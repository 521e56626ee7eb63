"""The consumer watching itself for a stalled group: a partition with lag whose offset has
not been committed for ``stall_after_s`` (a handler failing over and over, a transaction that
never ends, a commit that keeps failing). One :class:`~outboxkit.outbox.alarm.Alarm`: a log
line when it starts and one when it clears, ``/readyz`` 503 naming the partitions, and the
``outboxkit_consumer_stalled`` gauge (:mod:`.metrics`). ``outboxkit status`` sees the same
from outside with the commit times the committer stamps (:mod:`.offsets`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from aiokafka import TopicPartition
from outboxkit.consumers.metrics import Positions
from outboxkit.outbox.alarm import Alarm
from outboxkit.outbox.readiness import Readiness

DEFAULT_STALL_AFTER_S = 300.0
log = logging.getLogger("outboxkit.consumer")


class GroupStallWatch:
    """Per assigned partition: since when it has had lag without a commit."""

    def __init__(self, positions: Positions, readiness: Readiness, after_s: float) -> None:
        if after_s <= 0:
            raise ValueError("stall_after_s must be positive")
        self.positions = positions
        self.after_s = after_s
        self.alarm = Alarm("stalled", readiness, log)
        self.longest_s = 0.0  # the longest a lagging partition has gone without a commit
        self._lagging_since: dict[tuple[str, int], float] = {}

    @property
    def interval_s(self) -> float:
        """Time between checks: a quarter of the stall time, 0.5 to 5 s."""
        return min(5.0, max(0.5, self.after_s / 4))

    def check(self, committed_at: Mapping[TopicPartition, float]) -> None:
        """Look at the lag now; ``committed_at``: each partition's last commit (monotonic)."""
        now = time.monotonic()
        lags = self.positions.lags()
        stuck: list[tuple[float, str, int, int]] = []
        for key in list(self._lagging_since):
            if lags.get(key, 0) == 0:
                del self._lagging_since[key]  # caught up, or no longer this member's
        for (topic, partition), lag in lags.items():
            if lag <= 0:
                continue
            since = self._lagging_since.setdefault((topic, partition), now)
            quiet = now - max(since, committed_at.get(TopicPartition(topic, partition), since))
            if quiet > self.after_s:
                stuck.append((quiet, topic, partition, lag))
        self.longest_s = max((entry[0] for entry in stuck), default=0.0)
        if not stuck:
            self.alarm.update(None)
            return
        quiet, topic, partition, lag = max(stuck)
        self.alarm.update(
            f"{len(stuck)} partition(s) lag with no offset committed for over "
            f"{self.after_s:g} s: {topic}[{partition}] lags {lag} record(s), nothing "
            f"committed for {quiet:.0f} s"
        )

    async def run(self, committed_at: Mapping[TopicPartition, float]) -> None:
        """Check every :attr:`interval_s` until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            self.check(committed_at)
