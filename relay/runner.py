"""The relay loop: heartbeat and shard leases, claim, publish, settle, clean up, wait."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass

from outboxkit.outbox.db import is_missing_table, make_async_engine, parse_url, require_tables
from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.errors import NotMigratedError
from outboxkit.outbox.health import DependencyHealth
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.readiness import Readiness
from outboxkit.outbox.secrecy import describe_error
from outboxkit.outbox.tables import (
    outbox_events,
    outbox_relays,
    outbox_shard_leases,
    outbox_slot_gaps,
    outbox_slot_positions,
)
from outboxkit.relay import metrics
from outboxkit.relay.claims import ClaimedRow, Claims
from outboxkit.relay.leases import ShardLeases
from outboxkit.relay.logical import LogicalStream
from outboxkit.relay.notify import CommitListener
from outboxkit.relay.options import RelayOptions
from outboxkit.relay.publisher import BatchOutcome, KafkaUnavailable, Publisher
from outboxkit.relay.retention import delete_published
from outboxkit.relay.stall import StallWatch
from outboxkit.relay.waiting import DATABASE_ERRORS
from outboxkit.relay.waiting import sleep_unless as _sleep_unless
from outboxkit.relay.waiting import wait_any as _wait_any
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("outboxkit.relay")
RELAY_TABLES = (
    outbox_events.name,
    outbox_shard_leases.name,
    outbox_relays.name,
    outbox_slot_positions.name,  # logical mode's last position, and its gaps (0018)
    outbox_slot_gaps.name,
)
# Waking this much after a row's due time: the database clock has then passed it for sure.
DUE_MARGIN_S = 0.002


@dataclass
class RelayStats:
    """Counters of one :class:`Relay` since it was made (across restarts)."""

    published: int = 0
    failed: int = 0
    batches: int = 0
    cleaned: int = 0


class Relay:
    """Publishes committed outbox rows to Kafka, at least once and in order per key.

    Several relays may run against one database; each publishes the shards it leases. Give it
    exactly one of ``engine`` (yours: the relay never disposes it) or ``db_url`` (the relay
    makes its engine and disposes it on stop)::

        async with Relay(db_url=url, kafka=KafkaSettings(bootstrap="kafka:9092")) as relay:
            ...  # publishing in the background; relay.stats counts

    ``start`` begins the work in a background task and returns; database and Kafka outages
    are retried there with backoff, so a relay may start before its dependencies. A database
    without outboxkit's tables is no outage: the work fails at once with
    :class:`~outboxkit.outbox.errors.NotMigratedError`, raised by ``run``/``drain``/``stop``.
    ``stop`` finishes gracefully: the batch in flight is acknowledged and recorded, the shard leases
    are released (another relay takes over at once) and the connections closed. ``run``
    works until ``stop`` is called; ``drain`` until nothing is pending, then stops.
    """

    def __init__(
        self,
        *,
        engine: AsyncEngine | None = None,
        db_url: str | None = None,
        kafka: KafkaSettings,
        options: RelayOptions | None = None,
        relay_id: str | None = None,
    ) -> None:
        if (engine is None) == (db_url is None):
            raise ValueError("give exactly one of engine= or db_url=")
        self.options = options or RelayOptions()
        self.relay_id = relay_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.stats = RelayStats()
        self._owns_engine = engine is None
        # no pre-ping on an engine of ours: see Claims._execute
        self.engine = engine if engine is not None else self._own_engine(str(db_url))
        self.leases = ShardLeases(
            self.engine,
            self.relay_id,
            socket.gethostname(),
            os.getpid(),
            round(self.options.lease_ttl_s * 1000),
            take_all=self.options.mode == "logical",
        )
        self.claims = Claims(self.engine, self.relay_id)
        self.publisher = Publisher(
            kafka,
            request_timeout_s=self.options.request_timeout_s,
            linger_s=self.options.linger_s,
            max_batch_bytes=self.options.max_batch_bytes,
            max_request_size=self.options.max_request_size,
            client_id=f"outboxkit-relay-{self.relay_id}",
        )
        # What /readyz answers (outbox/metrics_server.py): ready while it holds a shard lease
        # and its last database and Kafka round trips worked.
        self.readiness = Readiness(assigned_what="shard_leases", min_assigned=1)
        self.database = DependencyHealth("database", self.readiness.mark_database, log)
        self.kafka = DependencyHealth("kafka", self.readiness.mark_broker, log)
        self.stall = StallWatch(
            self.engine,
            self.leases,
            self.readiness,
            after_s=self.options.stall_after_s,
            max_slot_lag_bytes=self.options.max_slot_lag_bytes,
        )
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._until_drained = False
        self._settling = _SettleInFlight()
        self._task: asyncio.Task[None] | None = None
        self._stall_task: asyncio.Task[None] | None = None
        self._not_migrated = False
        self.logical: LogicalStream | None = None  # the work loop, in logical mode

    def _own_engine(self, db_url: str) -> AsyncEngine:
        """The relay's engine for ``db_url``; on PostgreSQL each statement is bounded by
        ``statement_timeout_s`` (the driver gives up and the pool drops the connection)."""
        bound = dialect_of(parse_url(db_url)).statement_timeout_args
        return make_async_engine(db_url, connect_args=bound(self.options.statement_timeout_s))

    @property
    def running(self) -> bool:
        """True from ``start`` until the work has stopped (after ``stop``, a drain or a failure)."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Begin relaying in a background task and return; raises if already running."""
        if self.running:
            raise RuntimeError(f"relay {self.relay_id} is already running")
        self._stopping.clear()
        self.readiness.start()
        self._task = asyncio.create_task(self._work(), name=f"outboxkit-relay-{self.relay_id}")
        self._stall_task = asyncio.create_task(self.stall.run(), name="outboxkit-stall-watch")

    async def stop(self) -> None:
        """Stop gracefully and wait until stopped; safe to call any number of times.

        The batch in flight is acknowledged and its rows recorded (so no other relay sends
        them again), shard leases are released and connections closed. If the work failed,
        its error is raised here (as by ``run``), every time.
        """
        self._stopping.set()
        if self._task is None:
            return
        await asyncio.wait([self._task])
        self._task.result()

    async def run(self) -> None:
        """Start, then relay until ``stop`` is called; re-raises the error the work failed with.

        Cancelling ``run`` stops the relay gracefully before the cancellation propagates.
        """
        await self.start()
        assert self._task is not None
        try:
            await asyncio.wait([self._task])
        finally:
            await self.stop()

    async def drain(self, timeout_s: float | None = 120.0) -> int:
        """Publish until no row is due, then stop; return how many rows this call published.

        Rows scheduled for later stay in the outbox for a relay running when they are due.
        Starts the relay if it is not running. Raises :class:`TimeoutError` after ``timeout_s``
        seconds (``None``: no limit), having stopped the relay gracefully.
        """
        before = self.stats.published
        self._until_drained = True
        self._wake.set()
        try:
            if self.running:
                assert self._task is not None
                await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
                await self.stop()
            else:
                await asyncio.wait_for(self.run(), timeout_s)
        finally:
            self._until_drained = False
            if self.running:
                await self.stop()
        return self.stats.published - before

    async def __aenter__(self) -> Relay:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _work(self) -> None:
        listener = None
        if self.options.listen and dialect_of(self.engine).listen_notify:
            listener = CommitListener(self.engine.url, self._wake)
            listener.start()
        log.info("relay %s started (%s mode)", self.relay_id, self.options.mode)
        try:
            if self.options.mode == "logical":
                self.logical = LogicalStream(self)
                await self.logical.run(self._stopping)
            else:
                await self._loop(self._stopping)
        finally:
            if self._stall_task is not None:
                self._stall_task.cancel()
                await asyncio.gather(self._stall_task, return_exceptions=True)
            await self.readiness.stop()
            if listener is not None:
                await listener.stop()
            await self._shutdown()

    async def _loop(self, stop: asyncio.Event) -> None:
        heartbeat_every = self.options.lease_ttl_s / 3
        next_heartbeat = 0.0
        next_cleanup = time.monotonic() + self.options.cleanup_interval_s
        while not stop.is_set():
            try:
                if time.monotonic() >= next_heartbeat:
                    # A heartbeat may hand shards to another relay: first record every row this
                    # relay published, or the other one would publish them again.
                    await self._settling.wait()
                    await self._sample_backlog()
                    owned = await self.leases.heartbeat(self.stall.published_ago_s())
                    self.readiness.mark_assigned(len(owned))
                    self.database.succeeded()
                    await self.publisher.ping()  # Kafka's health even when nothing is pending
                    self.kafka.succeeded()
                    next_heartbeat = time.monotonic() + heartbeat_every
                    if not owned:
                        log.debug("no shard leased; waiting")
                claimed = await self._relay_batches(until=next_heartbeat)
                if self.options.retention_s and time.monotonic() >= next_cleanup:
                    self.stats.cleaned += await delete_published(
                        self.engine,
                        int(self.options.retention_s * 1000),
                        self.options.cleanup_chunk,
                    )
                    next_cleanup = time.monotonic() + self.options.cleanup_interval_s
                self.database.succeeded()
            except DATABASE_ERRORS as error:
                await self._fail_if_not_migrated(error)
                attempt = self.database.failed(error)
                await _sleep_unless(stop, self.options.outage_backoff.delay(attempt))
                continue
            except KafkaUnavailable as error:
                attempt = self.kafka.failed(error)
                await _sleep_unless(stop, self.options.outage_backoff.delay(attempt))
                continue
            if claimed:
                continue
            try:
                await self._settling.wait()
                if self._until_drained and await self.claims.pending_count() == 0:
                    return
                next_due_s = await self.claims.next_due_in_s()
            except DATABASE_ERRORS as error:
                await self._fail_if_not_migrated(error)
                attempt = self.database.failed(error)
                await _sleep_unless(stop, self.options.outage_backoff.delay(attempt))
                continue
            # Commits wake the relay (LISTEN); a scheduled row coming due is no commit, so the
            # relay sleeps no longer than until the next one of its shards is due.
            wait_s = self.options.poll_interval_s
            if next_due_s is not None:
                wait_s = min(wait_s, next_due_s + DUE_MARGIN_S)
            await _wait_any(stop, self._wake, wait_s)

    async def _relay_batches(self, until: float) -> int:
        """Publish batches back to back while there is more; return the rows claimed.

        Three things overlap: batch N+1 is being acknowledged, batch N is being settled in the
        database, and batch N+2 is being claimed. N+2 is claimed during N+1's flight when N+1
        came full or a commit was notified meanwhile, and sent only after N+1's outcome is
        known; rows of a key that failed in N or N+1 are dropped from it (they stay pending
        and come back in a later claim), so a key never overtakes its own failed row, whether
        or not N's settle has written the retry yet. Stops claiming at ``until``
        (monotonic), when the shard leases are due for renewal.
        """
        await self.publisher.start()  # before claiming: an outage leaves nothing half done
        if self._settling.failed_keys:
            await self._settling.wait()  # rare: a row failed, its retry time must be written first
        self._wake.clear()
        rows = await self.claims.claim(self.options.batch_size, self._settling.ids)
        total = 0
        while rows:
            total += len(rows)
            sending = asyncio.ensure_future(self.publisher.publish(rows))
            next_rows: list[ClaimedRow] = []
            try:
                more = len(rows) >= self.options.batch_size or self._wake.is_set()
                if more and time.monotonic() < until and not self._stopping.is_set():
                    self._wake.clear()
                    in_flight = [row.id for row in rows] + self._settling.ids
                    next_rows = await self.claims.claim(self.options.batch_size, in_flight)
            finally:
                outcome = await sending
                failed_keys = outcome.failed_keys | self._settling.failed_keys
                await self._settling.replace(rows, outcome.failed_keys, self._settle(outcome))
            if outcome.outage is not None:
                raise await self.publisher.recreate(outcome.outage)
            self.kafka.succeeded()
            rows = [row for row in next_rows if row.key is None or row.key not in failed_keys]
        return total

    async def _fail_if_not_migrated(self, error: BaseException) -> None:
        """Raise :class:`NotMigratedError` if ``error`` says a table is missing and one of the
        relay's is: retrying could never succeed. Any other database error is retried."""
        if not is_missing_table(error):
            return
        try:
            await require_tables(self.engine, RELAY_TABLES)
        except DATABASE_ERRORS:
            return  # the database went away meanwhile: an outage after all, retried
        except NotMigratedError:
            self._not_migrated = True  # nothing to release on the way out
            raise

    async def _sample_backlog(self) -> None:
        backlog = await self.claims.backlog()
        metrics.BACKLOG.set(backlog.pending)
        metrics.OLDEST_AGE.set(backlog.oldest_age_s)
        metrics.PARKED.set(backlog.parked)
        metrics.SCHEDULED.set(backlog.scheduled)

    async def _settle(self, outcome: BatchOutcome, *, delete_published: bool = False) -> None:
        matched = await self.claims.settle(
            outcome.published,
            outcome.failed,
            delete_published=delete_published or self.options.retention_s == 0,
            max_attempts=self.options.max_attempts,
            retry_delay_ms=lambda attempt: int(self.options.row_backoff.delay(attempt) * 1000),
        )
        self.stats.batches += 1
        self.stats.published += len(outcome.published)
        self.stall.published(len(outcome.published))
        self.stats.failed += len(outcome.failed)
        metrics.BATCH_SIZE.observe(len(outcome.published) + len(outcome.failed))
        metrics.PUBLISHED.inc(len(outcome.published))
        metrics.PUBLISH_ERRORS.labels("record").inc(len(outcome.failed))
        metrics.PUBLISH_ERRORS.labels("outage").inc(len(outcome.released))
        metrics.PARKED_NOW.inc(
            sum(1 for f in outcome.failed if f.row.attempts + 1 >= self.options.max_attempts)
        )
        if matched < len(outcome.published):
            log.warning(
                "%d published rows were marked by another relay meanwhile (a lease takeover)",
                len(outcome.published) - matched,
            )
        for failure in outcome.failed:
            attempt = failure.row.attempts + 1
            parked = attempt >= self.options.max_attempts
            log.warning(
                "row %s %s (attempt %d of %d): %s",
                failure.row.id,
                "parked" if parked else "failed, will retry",
                attempt,
                self.options.max_attempts,
                failure.error,
                extra={"event_id": failure.row.event_id, "attempt": attempt, "parked": parked},
            )

    async def _shutdown(self) -> None:
        try:
            await self._settling.wait()
        except DATABASE_ERRORS as error:
            log.warning(
                "could not record the last batch (its rows will be sent again): %s",
                describe_error(error),
            )
        try:
            if not self._not_migrated:
                await self.leases.release_all()
        except DATABASE_ERRORS as error:
            log.warning(
                "could not release shard leases (they expire on their own): %s",
                describe_error(error),
            )
        await self.publisher.stop()
        if self._owns_engine:
            await self.engine.dispose()
        log.info(
            "relay %s stopped: %d published, %d failed attempts",
            self.relay_id,
            self.stats.published,
            self.stats.failed,
        )


class _SettleInFlight:
    """The one batch whose outcome is being written while the next batch is in flight."""

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None
        self.ids: list[int] = []
        self.failed_keys: set[bytes] = set()

    async def replace(
        self, rows: list[ClaimedRow], failed_keys: set[bytes], settle: Awaitable[None]
    ) -> None:
        """Wait for the previous settle (its error surfaces here), then start ``settle`` of
        ``rows``; until it is done their ids are kept out of claims."""
        try:
            await self.wait()
        finally:
            self._future = asyncio.ensure_future(settle)
            self.ids, self.failed_keys = [row.id for row in rows], failed_keys

    async def wait(self) -> None:
        """Wait for the settle in flight, if any; raise its error."""
        future, self._future = self._future, None
        self.ids, self.failed_keys = [], set()
        if future is not None:
            await future
