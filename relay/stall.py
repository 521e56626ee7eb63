"""The relay watching itself for a stall: rows wait on its shards while it has published
nothing for ``stall_after_s``; in logical mode, its slot about to be or already invalidated,
or lagging more than ``max_slot_lag_bytes``.

The check runs in a task of its own with its own database reads, so a work loop that hangs
(a broker that never answers, a wedged stream) is seen all the same. Each condition is an
:class:`~outboxkit.outbox.alarm.Alarm` (a log line when it starts and one when it clears,
``/readyz`` 503 naming it) and a gauge. A relay that is stopped (SIGSTOP) or dead cannot say
anything itself: ``outboxkit status`` sees it from the database (``outbox_relays.published_ms``,
written with each heartbeat from :meth:`StallWatch.published_ago_s`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from outboxkit.outbox.alarm import Alarm
from outboxkit.outbox.readiness import Readiness
from outboxkit.relay.leases import ShardLeases
from outboxkit.relay.outbox_counts import oldest_due_in
from outboxkit.relay.slot import SlotLag, slot_state
from prometheus_client import Gauge
from sqlalchemy.ext.asyncio import AsyncEngine

STALLED = Gauge(
    "outboxkit_relay_stalled",
    "1 while rows wait on this relay's shards and it has published nothing for stall_after_s.",
)
QUIET = Gauge(
    "outboxkit_relay_last_published_age_seconds",
    "Seconds since this relay last had a row acknowledged (since it started, if never).",
)
SLOT_LAG = Gauge(
    "outboxkit_replication_slot_lag_bytes",
    "WAL bytes from the server's position to the slot's confirmed position (logical mode).",
    ["slot"],
)
SLOT_ACTIVE = Gauge(
    "outboxkit_replication_slot_active",
    "1 while a session streams the slot (the stream reader; the sql reader only while reading).",
    ["slot"],
)
SLOT_ALARM = Gauge(
    "outboxkit_replication_slot_alarm",
    "1 while the relay's slot is about to be or was invalidated, or lags past its limit.",
    ["slot"],
)
# wal_status values past which WAL the slot needs is no longer reserved.
_UNSAFE = {"unreserved": "about to be invalidated", "lost": "invalidated"}
log = logging.getLogger("outboxkit.relay")


class StallWatch:
    """When the relay last published, and the checks built on it (:meth:`run`)."""

    def __init__(
        self,
        engine: AsyncEngine,
        leases: ShardLeases,
        readiness: Readiness,
        *,
        after_s: float,
        slot: str | None = None,
        max_slot_lag_bytes: int | None = None,
    ) -> None:
        self.engine = engine
        self.leases = leases
        self.after_s = after_s
        self.slot = slot
        self.max_slot_lag_bytes = max_slot_lag_bytes
        self.stalled = Alarm("stalled", readiness, log)
        self.slot_alarm = Alarm("slot", readiness, log)
        self._started = time.monotonic()
        self._published_at: float | None = None

    def published(self, rows: int) -> None:
        """``rows`` were acknowledged by Kafka now."""
        if rows:
            self._published_at = time.monotonic()

    def published_ago_s(self) -> float | None:
        """Seconds since the last acknowledged row (``None``: none since the start)."""
        return None if self._published_at is None else time.monotonic() - self._published_at

    def quiet_s(self) -> float:
        """Seconds without a publish: since the last one, or since the start."""
        return time.monotonic() - (self._published_at or self._started)

    @property
    def interval_s(self) -> float:
        """Time between checks: a quarter of the stall time, 0.5 to 5 s."""
        return min(5.0, max(0.5, self.after_s / 4))

    def verdict(self, oldest_age_s: float | None) -> str | None:
        """Why this relay is stalled, given the age of the oldest due row on its shards, or
        ``None``: a row due longer than ``after_s`` while nothing was published as long."""
        quiet = self.quiet_s()
        QUIET.set(quiet)
        if oldest_age_s is None or oldest_age_s <= self.after_s or quiet <= self.after_s:
            return None
        return (
            f"the oldest due row on its {len(self.leases.owned)} shard(s) has waited "
            f"{oldest_age_s:.0f} s and nothing was published for {quiet:.0f} s "
            f"(stall after {self.after_s:g} s)"
        )

    def slot_verdict(self, lag: SlotLag | None) -> str | None:
        """Why the relay's slot needs an operator, or ``None``."""
        if lag is None:
            return None
        if lag.wal_status in _UNSAFE:
            return (
                f"slot {lag.name} is {_UNSAFE[lag.wal_status]} (wal_status {lag.wal_status}, "
                f"max_slot_wal_keep_size): WAL messages not yet published are lost with it"
            )
        most = self.max_slot_lag_bytes
        if most is not None and lag.lag_bytes > most:
            return f"slot {lag.name} lags {lag.lag_bytes} bytes (limit {most})"
        return None

    async def check(self) -> None:
        """Read the oldest due row on the owned shards (and the slot) and update the alarms."""
        async with asyncio.timeout(max(self.interval_s, 5.0)), self.engine.connect() as conn:
            now_ms, oldest_ms = await oldest_due_in(conn, self.leases.owned)
            mine = await slot_state(conn, self.slot) if self.slot is not None else None
        age = None if oldest_ms is None else max(0, now_ms - oldest_ms) / 1000
        self.stalled.update(self.verdict(age))
        STALLED.set(int(self.stalled.on))
        if mine is not None:
            SLOT_LAG.labels(mine.name).set(mine.lag_bytes)
            SLOT_ACTIVE.labels(mine.name).set(int(mine.active))
        self.slot_alarm.update(self.slot_verdict(mine))
        if self.slot is not None:
            SLOT_ALARM.labels(self.slot).set(int(self.slot_alarm.on))

    async def run(self) -> None:
        """Check every :attr:`interval_s` until cancelled. A failed read changes nothing (the
        database's own readiness and log line say it is unreachable)."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception as error:  # an outage: said by the work loop, checked again
                log.debug("stall check failed: %s", type(error).__name__)
