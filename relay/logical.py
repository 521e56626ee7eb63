"""Logical mode: publish outbox inserts decoded from a replication slot, in commit order.

One relay per slot is active: it holds every shard lease (``ShardLeases`` taking all or none),
so a standby waits until the active relay's leases expire, then takes over the slot. The
active relay loops:

1. read whole transactions from the slot: streamed over the replication protocol
   (:class:`~outboxkit.relay.replication.SlotStream`, the default) or peeked with SQL
   (:class:`~outboxkit.relay.slot.Slot`); decode the inserts and the outbox's WAL messages
   (:mod:`~outboxkit.relay.pgoutput`, :mod:`~outboxkit.outbox.wal_message`);
2. publish the unscheduled rows with the relay's :class:`~outboxkit.relay.publisher.Publisher`;
   a row Kafka refuses for a reason of its own is handed to the table (an attempt counted,
   retried later with backoff, parked after ``max_attempts``) and does not hold the stream;
3. delete the published rows, then advance the slot to the last transaction's end (only after
   Kafka acknowledged all of it: a crash before the advance publishes them again). A WAL
   message Kafka refuses is written to the table as a failed row (retried from there).

Rows the stream does not publish live on in the table, read by a small claim: scheduled rows
once due, and rows handed over after a failure or requeued by an operator. When the slot is
created, rows already in the table are published first with the polling claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from outboxkit.outbox import wal_message
from outboxkit.outbox.clock import db_now_ms
from outboxkit.outbox.dialects import POSTGRESQL
from outboxkit.outbox.health import DependencyHealth
from outboxkit.outbox.secrecy import describe_error
from outboxkit.outbox.sharding import SHARD_COUNT, shard_for
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay import catch_up, failover, metrics
from outboxkit.relay.claims import PENDING, ClaimedRow, Failure, claimed_rows
from outboxkit.relay.pgoutput import Decoder, Message, Transaction
from outboxkit.relay.publisher import KafkaUnavailable
from outboxkit.relay.replication import SlotStream, StreamLost, require_driver
from outboxkit.relay.slot import (
    PUBLICATION,
    Slot,
    default_slot_name,
    lsn_text,
    parse_lsn,
    refusal,
    require_logical,
)
from outboxkit.relay.waiting import DATABASE_ERRORS, sleep_unless, wait_any
from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert

if TYPE_CHECKING:
    from outboxkit.relay.runner import Relay

log = logging.getLogger("outboxkit.relay")
# A refusal that lasts (no REPLICATION attribute...) is logged this often, not per attempt.
REFUSAL_LOG_EVERY_S = 60.0
# The slot's confirmed position is recorded this often at most (relay/failover.py): a gap
# found after a failover starts at most this much WAL before the old slot's true position.
REMEMBER_EVERY_S = 1.0
# pgoutput messages per outbox row in the usual transaction: Begin, Insert, Commit.
MESSAGES_PER_ROW = 3
# The columns of an outbox insert the stream decodes (the rest are skipped unread), in the
# order :func:`_rows` unpacks them.
DECODED: dict[str, tuple[str, ...]] = {
    outbox_events.name: (
        "id",
        "topic",
        "kafka_key",
        "headers",
        "payload",
        "deliver_at_ms",
        "last_error",
    )
}
# Header values unique to each event: not worth keeping in the cache of encoded headers.
_UNIQUE_HEADERS = frozenset({"ce_id", "ce_time", "traceparent", "tracestate"})
_HEADER_CACHE_SIZE = 4096


class SlotRefused(Exception):
    """The database refuses what streaming the slot needs (:func:`~.slot.refusal`)."""

    outboxkit_safe_message = True  # its messages are written by outboxkit (outbox/secrecy.py)


class LeasesLost(Exception):
    """Another relay took the shard leases (this one stalled past their lifetime)."""

    outboxkit_safe_message = True  # its messages are written by outboxkit (outbox/secrecy.py)


@dataclass(frozen=True, slots=True)
class _Batch:
    """Transactions read from the slot: their rows to publish, the last one's end, how many
    messages they took and whether the read came full (more may follow)."""

    rows: list[ClaimedRow]
    end_lsn: int
    messages: int
    full: bool


class LogicalStream:
    """The work loop of a :class:`~outboxkit.relay.runner.Relay` in logical mode."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.options = relay.options
        self.slot: Slot | None = None
        self.decoder = Decoder(DECODED)
        self._headers: dict[tuple[str, str], tuple[str, bytes]] = {}
        self.stream: SlotStream | None = None
        self._drain_marker: int | None = None
        self._ready = False  # the slot exists and the rows before it were published
        # Ids the catch-up published that the stream may decode too, until the stream passed
        # the WAL position where the catch-up ended (relay/catch_up.py).
        self._overlap: set[int] = set()
        self._overlap_until = 0
        self._streamed = False  # this relay streamed the slot before (a vanished slot: dropped)
        # The server streamed from, the last position confirmed on it, whether an outbox WAL
        # message was decoded, and when the position was last recorded (relay/failover.py).
        self._server: failover.Server | None = None
        self._confirmed_lsn = 0
        self._messages_seen = False
        self._remembered_at = 0.0
        self._remembered_lsn = 0
        # The replication session, apart from the database's health: the heartbeat's
        # round trip may work while the stream keeps failing (a slot held, no REPLICATION).
        self.replication = DependencyHealth("replication stream", self._mark_stream, log)
        self._refused = 0  # attempts refused in a row (SlotRefused)
        self._refusal_logged_at = -REFUSAL_LOG_EVERY_S
        self._next_table_claim = 0.0
        # The statement's clock, which the planner reads when it estimates the due scheduled
        # rows (behind the volatile clock it guessed a third of them: relay/claims.py).
        now = POSTGRESQL.statement_now_ms()
        rows = outbox_events.c
        handed_over = rows.deliver_at_ms.is_(None) & rows.last_error.is_not(None)
        due_scheduled = rows.deliver_at_ms.is_not(None) & (rows.deliver_at_ms <= now)
        self._table_claim = (
            select(rows.id, rows.topic, rows.kafka_key, rows.headers, rows.payload, rows.attempts)
            .where(PENDING, rows.available_ms <= now, handed_over | due_scheduled)
            .order_by(func.coalesce(rows.deliver_at_ms, rows.available_ms), rows.id)
            .limit(self.options.batch_size)
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop`` is set (or, draining, until nothing is left)."""
        relay = self.relay
        while self.slot is None and not stop.is_set():
            try:  # a database down at start is an outage like any other: retried
                await require_logical(relay.engine)
                if self.options.logical_reader == "stream":
                    require_driver()  # refused at start, in one line, not retried as an outage
                name = self.options.slot_name
                if name is None:
                    async with relay.engine.connect() as conn:
                        database = await conn.scalar(select(func.current_database()))
                    name = default_slot_name(str(database))
                self.slot = Slot(relay.engine, name)
                relay.stall.slot = name
            except DATABASE_ERRORS as error:
                attempt = relay.database.failed(error)
                await sleep_unless(stop, self.options.outage_backoff.delay(attempt))
        try:
            await self._loop(stop)
        finally:
            await self._close_stream()
            await self._remember_last()

    async def _remember_last(self) -> None:
        """Record the last confirmed position on the way out, so a restart after a drain
        finds the slot's exact position (a failover in between: no false gap)."""
        with contextlib.suppress(*DATABASE_ERRORS):
            await self._remember()

    async def _remember(self) -> None:
        """Record the server and the position last confirmed on it (relay/failover.py)."""
        if self.slot is None or self._server is None:
            return
        self._remembered_at = time.monotonic()
        confirmed = self._confirmed_lsn
        await failover.remember(
            self.relay.engine, self.slot.name, self._server, confirmed, messages=self._messages_seen
        )
        self._remembered_lsn = confirmed

    async def _loop(self, stop: asyncio.Event) -> None:
        relay = self.relay
        assert self.slot is not None
        heartbeat_every = self.options.lease_ttl_s / 3
        next_heartbeat = 0.0
        active = False
        while not stop.is_set():
            try:
                if time.monotonic() >= next_heartbeat:
                    await relay._sample_backlog()
                    owned = await relay.leases.heartbeat(relay.stall.published_ago_s())
                    was_active, active = active, len(owned) == SHARD_COUNT
                    relay.readiness.mark_assigned(len(owned))
                    relay.database.succeeded()
                    await relay.publisher.ping()
                    relay.kafka.succeeded()
                    await self._show_gaps()
                    next_heartbeat = time.monotonic() + heartbeat_every
                    if active and not was_active:
                        log.info("relay %s holds slot %s", relay.relay_id, self.slot.name)
                    if not active:
                        self._ready = False
                        await self._close_stream()
                if not active:
                    log.debug("slot %s is another relay's; standing by", self.slot.name)
                    await sleep_unless(stop, max(0.0, next_heartbeat - time.monotonic()))
                    continue
                if not self._ready:
                    await self._begin()
                    self._ready = True
                if self.options.logical_reader == "stream" and self.stream is None:
                    self._open_stream()
                relay._wake.clear()
                worked = await self._stream(until=next_heartbeat, stop=stop)
                if self.stream is None or self.stream.up:
                    self.replication.succeeded()
                if time.monotonic() >= self._next_table_claim:
                    # Due timers and retries: no commit wakes them, so they are looked for
                    # once per poll interval (and when the next timer is due), not per wake-up.
                    claimed = await self._table_rows()
                    if not claimed:
                        self._next_table_claim = time.monotonic() + self.options.poll_interval_s
                    worked += claimed
                relay.database.succeeded()
            except StreamLost as error:
                # Transactions taken from the stream and not confirmed come again only in a
                # new session (from the slot's confirmed position). The slot may be gone
                # (dropped, invalidated): looked at again before streaming.
                await self._close_stream()
                self._ready = False
                attempt = self.replication.failed(error)
                relay.readiness.mark_problem("replication", describe_error(error))
                await sleep_unless(stop, self.options.outage_backoff.delay(attempt))
                continue
            except SlotRefused as error:
                # It may come back (a slot freed, a role granted REPLICATION): retried with
                # growing pauses, logged once a minute, named by /readyz meanwhile.
                await self._close_stream()
                self._refused += 1
                relay.readiness.mark_problem("replication", describe_error(error))
                if time.monotonic() >= self._refusal_logged_at + REFUSAL_LOG_EVERY_S:
                    self._refusal_logged_at = time.monotonic()
                    log.error("logical mode cannot stream: %s; retrying", describe_error(error))
                await sleep_unless(stop, self.options.outage_backoff.delay(self._refused))
                continue
            except LeasesLost as error:
                log.warning("%s; standing by", describe_error(error))
                await self._close_stream()
                self._ready = active = False
                next_heartbeat = 0.0
                continue
            except DATABASE_ERRORS as error:
                await self._close_stream()
                self._ready = False
                await relay._fail_if_not_migrated(error)
                attempt = relay.database.failed(error)
                await sleep_unless(stop, self.options.outage_backoff.delay(attempt))
                continue
            except KafkaUnavailable as error:
                await self._close_stream()
                attempt = relay.kafka.failed(error)
                await sleep_unless(stop, self.options.outage_backoff.delay(attempt))
                continue
            if worked:
                continue
            try:
                if self._confirmed_lsn > self._remembered_lsn:
                    await self._remember()  # idle: the exact position, for a failover
                if (
                    relay._until_drained
                    and await relay.claims.pending_count() == 0
                    and await self._slot_drained()
                ):
                    return
                next_due_s = await relay.claims.next_due_in_s()
            except DATABASE_ERRORS as error:
                await self._close_stream()
                attempt = relay.database.failed(error)
                await sleep_unless(stop, self.options.outage_backoff.delay(attempt))
                continue
            wait_s = min(self.options.poll_interval_s, max(0.0, next_heartbeat - time.monotonic()))
            if next_due_s is not None:
                wait_s = min(wait_s, next_due_s + 0.002)
                self._next_table_claim = min(
                    self._next_table_claim, time.monotonic() + next_due_s + 0.002
                )
            await wait_any(stop, relay._wake, wait_s)

    def _open_stream(self) -> None:
        assert self.slot is not None
        relay = self.relay
        self.stream = SlotStream(
            relay.engine.url,
            self.slot.name,
            PUBLICATION,
            relay._wake.set,
            DECODED,
            max_transactions=4 * self.options.batch_size,
        )
        self.stream.start(asyncio.get_running_loop().call_soon_threadsafe)
        self.slot.stream = self.stream

    async def _close_stream(self) -> None:
        stream, self.stream = self.stream, None
        if self.slot is not None:
            self.slot.stream = None
        if stream is not None:
            await stream.close()

    async def _slot_drained(self) -> bool:
        """Whether the slot has nothing left for a drain (rows are not all there is: WAL
        messages live only in the slot). The SQL reader's last peek was empty; the stream
        is drained once it received a marker written now, with nothing after it."""
        if self.stream is None or self.slot is None:
            return True
        if self._drain_marker is None:
            self._drain_marker = await self.slot.marker()
        if self.stream.caught_up(self._drain_marker):
            self._drain_marker = None
            return True
        return False

    async def _stream(self, until: float, stop: asyncio.Event) -> int:
        """Publish and confirm transactions from the slot while there are more (until the
        lease is due for renewal); return how many rows were published.

        Three things overlap: batch N is in flight to Kafka while batch N-1 is confirmed
        (deleted, slot advanced) and batch N+1 is read. N+1 is read after N-1's confirmation,
        skipping N's messages (the slot gives them again until N is confirmed), so what is
        skipped is exactly what is in flight.
        """
        assert self.slot is not None
        relay = self.relay
        await relay.publisher.start()
        total = 0
        batch = await self._read(skip=0)
        confirming: asyncio.Future[int] | None = None
        try:
            while batch is not None:
                sending = asyncio.ensure_future(self._publish(batch.rows))
                next_batch = None
                try:
                    if confirming is not None:
                        total += await confirming
                        confirming = None
                    if batch.full and time.monotonic() < until and not stop.is_set():
                        next_batch = await self._read(skip=batch.messages)
                finally:
                    published = await sending
                confirming = asyncio.ensure_future(self._confirm(batch.end_lsn, published))
                batch = next_batch
        finally:
            if confirming is not None:
                total += await confirming
        return total

    async def _read(self, skip: int) -> _Batch | None:
        """The next transactions after the first ``skip`` messages past the confirmed
        position, decoded; ``None`` if there are none."""
        assert self.slot is not None
        if self.stream is not None:
            transactions, more = self.stream.take(self.options.batch_size)
            if not transactions:
                return None
            rows = await self._decoded(transactions)
            return _Batch(rows, transactions[-1].end_lsn, 0, more)
        wanted = self.options.batch_size * MESSAGES_PER_ROW
        messages = await self.slot.peek(wanted, skip=skip)
        transactions = self.decoder.transactions(messages)
        if not transactions:
            return None
        rows = await self._decoded(transactions)
        counted = sum(1 for message in messages if message[:1] != b"R")
        return _Batch(rows, transactions[-1].end_lsn, counted, counted >= wanted)

    async def _decoded(self, transactions: list[Transaction]) -> list[ClaimedRow]:
        """The rows to publish from ``transactions``; outbox WAL messages that cannot be
        read are parked in the table (and not published)."""
        unreadable: list[tuple[Message, str]] = []
        rows = _rows(transactions, self._headers, unreadable)
        if not self._messages_seen and (unreadable or any(row.id < 0 for row in rows)):
            self._messages_seen = True
        if unreadable:
            await self._park_unreadable(unreadable)
        if self._overlap:
            rows = self._skip_caught_up(rows, transactions[-1].end_lsn)
        return rows

    async def _park_unreadable(self, unreadable: list[tuple[Message, str]]) -> None:
        """Park outbox WAL messages that cannot be decoded as rows of the table: a parked
        row per message (``source`` :data:`UNREADABLE_SOURCE`, ``event_id`` the message's
        LSN, the content as payload, the reason as ``last_error``), visible in ``status``
        and ``outbox list --parked``; the stream goes on past them. Logged once: a message
        read again (after a lost stream) finds its row there."""
        now = db_now_ms("postgresql")
        async with self.relay.engine.begin() as conn:
            for message, reason in unreadable:
                event_id = f"wal-message-{lsn_text(message.lsn)}"
                statement = (
                    insert(outbox_events)
                    .values(
                        source=UNREADABLE_SOURCE,
                        event_id=event_id,
                        type="outboxkit.unreadable",
                        topic="",
                        kafka_key=None,
                        shard=shard_for(None, event_id),
                        headers="{}",
                        payload=message.content,
                        created_ms=now,
                        available_ms=now,
                        attempts=0,
                        last_error=reason[:2000],
                        parked_ms=now,
                    )
                    .on_conflict_do_nothing(index_elements=["source", "event_id"])
                    .returning(outbox_events.c.id)
                )
                parked = await conn.scalar(statement)
                if parked is not None:
                    metrics.PARKED_NOW.inc()
                    log.error(
                        "outbox WAL message at %s cannot be read (%s): parked as row %s, "
                        "not published",
                        lsn_text(message.lsn),
                        reason,
                        parked,
                    )

    async def _confirm(self, end_lsn: int, published: list[int]) -> int:
        assert self.slot is not None
        await self.slot.confirm(end_lsn, published)
        self._confirmed_lsn = max(self._confirmed_lsn, end_lsn)
        if time.monotonic() >= self._remembered_at + REMEMBER_EVERY_S:
            await self._remember()
        self.relay.stats.published += len(published)
        self.relay.stall.published(len(published))
        metrics.PUBLISHED.inc(len(published))
        return len(published)

    async def _publish(self, rows: list[ClaimedRow]) -> list[int]:
        """Publish ``rows`` (in chunks of ``batch_size``); hand failed rows to the table;
        return the ids published. An outage raises :class:`KafkaUnavailable`: nothing of
        this peek is confirmed, it is read and published again."""
        relay = self.relay
        published: list[int] = []
        for start in range(0, len(rows), self.options.batch_size):
            chunk = rows[start : start + self.options.batch_size]
            while chunk:
                outcome = await relay.publisher.publish(chunk)
                if outcome.outage is not None:
                    raise await relay.publisher.recreate(outcome.outage)
                relay.stats.batches += 1
                metrics.BATCH_SIZE.observe(len(outcome.published) + len(outcome.failed))
                published += [row.id for row in outcome.published]
                if outcome.failed:
                    await self._settle_failed(outcome.failed)
                # Rows held back behind a failed row of their key: that row now waits in the
                # table, so the stream does not wait for it; they go on at once.
                chunk = outcome.released
        return published

    async def _settle_failed(self, failed: list[Failure]) -> None:
        relay = self.relay
        messages = [failure for failure in failed if isinstance(failure.row, MessageRow)]
        if messages:
            await self._hand_messages_to_table(messages)
            failed = [failure for failure in failed if not isinstance(failure.row, MessageRow)]
        await relay.claims.settle(
            [],
            failed,
            delete_published=True,
            max_attempts=self.options.max_attempts,
            retry_delay_ms=lambda attempt: int(self.options.row_backoff.delay(attempt) * 1000),
        )
        failed += messages
        relay.stats.failed += len(failed)
        metrics.PUBLISH_ERRORS.labels("record").inc(len(failed))
        for failure in failed:
            attempt = failure.row.attempts + 1
            parked = attempt >= self.options.max_attempts
            if parked:
                metrics.PARKED_NOW.inc()
            log.warning(
                "row %s %s (attempt %d of %d): %s",
                failure.row.id,
                "parked" if parked else "failed, will retry from the table",
                attempt,
                self.options.max_attempts,
                failure.error,
                extra={"event_id": failure.row.event_id, "attempt": attempt, "parked": parked},
            )

    async def _hand_messages_to_table(self, failed: list[Failure]) -> None:
        """Write WAL messages Kafka refused to the table as failed rows (an attempt counted,
        retried from the table with backoff, or parked): the slot moves past them."""
        now = db_now_ms("postgresql")
        rows = []
        for failure in failed:
            assert isinstance(failure.row, MessageRow)
            values = wal_message.decode(failure.row.content)
            values["shard"] = shard_for(values["kafka_key"], values["event_id"])
            values["last_error"] = failure.error[:2000]
            values["attempts"] = 1
            if self.options.max_attempts <= 1:
                values["parked_ms"] = now
            else:
                values["available_ms"] = now + int(self.options.row_backoff.delay(1) * 1000)
            rows.append(values)
        async with self.relay.engine.begin() as conn:
            for values in rows:
                values.setdefault("available_ms", now)
                statement = (
                    insert(outbox_events)
                    .values(**values, created_ms=now)
                    .on_conflict_do_nothing(index_elements=["source", "event_id"])
                )
                await conn.execute(statement)

    async def _table_rows(self) -> int:
        """Publish the rows the stream leaves to the table: scheduled rows that are due, and
        rows waiting for a retry or requeued; return how many were claimed."""
        async with self.relay.engine.connect() as conn:
            rows = claimed_rows((await conn.execute(self._table_claim)).all())
        if rows:
            await self._publish_claimed(rows)
        return len(rows)

    async def _begin(self) -> None:
        """Make sure the slot exists and every row written before it was published: create
        it (again) if it does not exist or was invalidated, then catch up from the table
        (relay/catch_up.py), also a catch-up a relay left unfinished."""
        assert self.slot is not None
        relay, name = self.relay, self.slot.name
        reason = await refusal(relay.engine, name)
        if reason is not None:
            raise SlotRefused(reason)
        relay.readiness.mark_problem("replication", None)
        self._refused = 0
        state = await catch_up.load(relay.engine, name)
        wal_status = await self.slot.inspect()
        if wal_status == "creating":
            # Another session is creating it: a relay killed while creating it leaves its
            # backend finishing the job. Rows committed until the slot is consistent are in no
            # slot, and the catch-up's bound (the highest id once the slot exists) must come
            # after them: waited for, with the stream's backoff.
            raise StreamLost(f"slot {name} is still being created by another session")
        server = await failover.server_of(relay.engine)
        seen = await failover.load_seen(relay.engine, name)
        moved = None if seen is None else server.differs(seen)
        if moved is not None:
            log.warning(
                "slot %s: the server changed since the slot was last confirmed (%s): a "
                "failover or a switchover",
                name,
                moved,
            )
        # Why the slot's history breaks here (the WAL after the old slot's position is not
        # decoded by the slot streamed from now on), if it does.
        cause: str | None = None
        if wal_status == "lost":
            log.error(
                "slot %s was invalidated (wal_status lost: it kept more WAL than "
                "max_slot_wal_keep_size); dropping it, recreating it and publishing the rows "
                "left in the table (outbox WAL messages not yet published are lost)",
                name,
            )
            await self.slot.drop()
            wal_status = None
            cause = "slot invalidated (wal_status lost)"
        elif wal_status is not None and moved is not None and not await self.slot.fails_over():
            # Created on this server after the change (a relay stopped before recording it).
            cause = f"failover ({moved}): the slot did not come along"
        if wal_status is None:
            if moved is not None:
                cause = f"failover ({moved}): the slot did not come along"
            elif cause is None and (seen is not None or self._streamed):
                cause = "slot dropped"
            if state is None and self._streamed and moved is None:
                log.error(
                    "slot %s is gone (dropped while this relay used it); recreating it and "
                    "publishing the rows left in the table (outbox WAL messages not yet "
                    "published are lost)",
                    name,
                )
            after = await catch_up.highest_id(relay.engine)
            await catch_up.intend(relay.engine, name, after)
            await self.slot.create()
            log.info("created slot %s; publishing the rows already in the table first", name)
            state = catch_up.CatchUpState(after, None, 0)
        starts = await self._slot_position()
        if (
            cause is None
            and state is not None
            and seen is not None
            and moved is None
            and seen.confirmed_lsn < starts
        ):
            # A catch-up left unfinished, of a slot that starts after the position recorded
            # before it: a relay re-created it and stopped before it recorded the break.
            cause = "slot dropped (re-created by a relay that stopped before recording it)"
        if cause is not None:
            old = seen.confirmed_lsn if seen is not None else 0
            if moved is None:  # same server: this relay's own position is comparable
                old = max(old, self._confirmed_lsn)
            messages = self._messages_seen or (seen is not None and seen.messages_seen_ms)
            await self._gap(cause, old, starts, messages=bool(messages))
        self._server, self._confirmed_lsn = server, starts
        await self._remember()
        if state is not None:
            until = state.until_id
            if until is None:
                until = await catch_up.bound(relay.engine, name)
            relay.readiness.mark_stage("catching up")
            runner = catch_up.CatchUp(
                relay.engine,
                name,
                self.options.batch_size,
                self._publish_caught_up,
                self._keep_leases,
                self.options.lease_ttl_s / 3,
                self._catch_up_progress,
                self._overlap,
            )
            await runner.run(state, until)
            async with relay.engine.connect() as conn:
                self._overlap_until = parse_lsn(
                    str(await conn.scalar(text("SELECT pg_current_wal_lsn()::text")))
                )
        log.info("slot %s: streaming from %s", name, lsn_text(await self._slot_position()))
        relay.readiness.mark_stage(f"streaming slot {name}")
        self._streamed = True

    async def _slot_position(self) -> int:
        """The slot's confirmed position."""
        assert self.slot is not None
        async with self.relay.engine.connect() as conn:
            confirmed = await conn.scalar(
                text(
                    "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                    "WHERE slot_name = :slot"
                ),
                {"slot": self.slot.name},
            )
        return parse_lsn(str(confirmed))

    async def _gap(self, cause: str, old: int, starts: int, *, messages: bool) -> None:
        """Report what the slot's break lost of the outbox WAL messages between ``old`` (the
        old slot's last known confirmed position) and ``starts`` (where this slot starts):
        a gap recorded and logged at ERROR when messages were lost or may have been."""
        assert self.slot is not None
        name = self.slot.name
        if old == 0:
            log.error(
                "slot %s: %s, with no position recorded before it: outbox WAL messages "
                "committed before %s and not yet published, if any, are lost",
                name,
                cause,
                lsn_text(starts),
            )
            return
        lost, note = await failover.count_lost(self.relay.engine, old, starts)
        between = f"between {lsn_text(old)} and {lsn_text(starts)}"
        if lost == 0 or (lost is None and not messages):
            # Nothing lost, or nothing known to be: the slot never decoded a WAL message.
            level, says = logging.INFO, f"no outbox WAL message {between}: none lost ({note})"
            if lost is None:
                level, says = (
                    logging.WARNING,
                    f"the outbox WAL messages {between}, if any, are lost ({note}; the slot "
                    "never decoded one, so none is assumed)",
                )
            log.log(level, "slot %s: %s; %s", name, cause, says)
            return
        gap = await failover.record_gap(self.relay.engine, name, cause, old, starts, lost, note)
        await self._show_gaps()
        log.error(
            "%s (%s); kept until acknowledged: outboxkit outbox gaps --ack %d",
            gap.line(),
            gap.count_note,
            gap.id,
        )

    async def _show_gaps(self) -> None:
        """Unacknowledged WAL-message gaps to the metrics and ``/readyz``."""
        async with self.relay.engine.connect() as conn:
            gaps = await failover.open_gaps(conn)
        metrics.WAL_MESSAGE_GAPS.set(len(gaps))
        metrics.WAL_MESSAGE_GAP_LOST.set(sum(gap.lost_events or 0 for gap in gaps))
        problem = None
        if gaps:
            problem = gaps[-1].line()
            if len(gaps) > 1:
                problem += f" (and {len(gaps) - 1} older gap(s))"
            problem += "; acknowledge with outboxkit outbox gaps --ack"
        self.relay.readiness.mark_problem("wal_message_gap", problem)

    async def _publish_caught_up(self, rows: list[ClaimedRow]) -> list[int]:
        relay = self.relay
        await relay.publisher.start()
        outcome = await relay.publisher.publish(rows)
        await relay._settle(outcome, delete_published=True)
        if outcome.outage is not None:
            raise await relay.publisher.recreate(outcome.outage)
        relay.kafka.succeeded()
        return [row.id for row in outcome.published]

    async def _keep_leases(self) -> None:
        relay = self.relay
        owned = await relay.leases.heartbeat(relay.stall.published_ago_s())
        relay.readiness.mark_assigned(len(owned))
        relay.database.succeeded()
        if len(owned) != SHARD_COUNT:
            raise LeasesLost(f"relay {relay.relay_id} lost the leases of slot {self.slot_name}")

    @property
    def refused_attempts(self) -> int:
        """Attempts refused in a row (:func:`~outboxkit.relay.slot.refusal`)."""
        return self._refused

    @property
    def slot_name(self) -> str:
        """The slot's name (once :meth:`run` has resolved it)."""
        return "?" if self.slot is None else self.slot.name

    def _catch_up_progress(self, published: int, total: int) -> None:
        self.relay.readiness.mark_stage(f"catching up: {published} of {total} rows published")

    def _mark_stream(self, ok: bool, reason: str) -> None:
        if ok:
            self.relay.readiness.mark_problem("replication", None)

    def _skip_caught_up(self, rows: list[ClaimedRow], end_lsn: int) -> list[ClaimedRow]:
        """``rows`` less those the catch-up published already (relay/catch_up.py)."""
        overlap = self._overlap
        rows = [row for row in rows if row.id not in overlap]
        if end_lsn >= self._overlap_until:
            overlap.clear()
        return rows

    async def _publish_claimed(self, rows: list[ClaimedRow]) -> None:
        relay = self.relay
        await relay.publisher.start()
        outcome = await relay.publisher.publish(rows)
        await relay._settle(outcome, delete_published=True)
        if outcome.outage is not None:
            raise await relay.publisher.recreate(outcome.outage)


UNREADABLE_SOURCE = "outboxkit:unreadable-wal-message"
"""The ``source`` of the parked rows standing for outbox WAL messages the relay cannot read."""


@dataclass(slots=True)
class MessageRow(ClaimedRow):
    """An event decoded from a WAL message: its id is minus the message's LSN (it has no
    row), and it keeps the message in case Kafka refuses it and the table takes it."""

    content: bytes


def _rows(
    transactions: list[Transaction],
    header_cache: dict[tuple[str, str], tuple[str, bytes]],
    unreadable: list[tuple[Message, str]],
) -> list[ClaimedRow]:
    """The rows to publish from the stream, in WAL order: unscheduled outbox inserts
    (scheduled ones and rows handed to the table are the table claim's) and the outbox's WAL
    messages, with their headers parsed in one go. An outbox WAL message that cannot be read
    (another version, a malformed content) goes to ``unreadable`` with the reason instead.

    Runs once per streamed event: no dictionary per row, and the header pairs that repeat
    from event to event (source, type, content type...) are encoded once and shared through
    ``header_cache`` (fewer objects also means fewer garbage collections).
    """
    wanted: list[tuple[Any, ...]] = []
    for transaction in transactions:
        for change in transaction.inserts:
            if isinstance(change, tuple):  # an outbox insert, the columns of DECODED
                if change[5] is None and change[6] is None:  # not scheduled, not handed over
                    wanted.append(change)
            elif change.prefix == wal_message.PREFIX:
                try:
                    _, _, _, topic, key, headers, payload = wal_message.unpack(change.content)
                except (ValueError, struct.error) as error:  # UnicodeDecodeError is one
                    unreadable.append((change, describe_error(error, with_class=True)))
                    continue
                wanted.append((-change.lsn, topic, key, headers, payload, change.content))
    if not wanted:
        return []
    try:
        all_headers = json.loads("[" + ",".join(values[3] for values in wanted) + "]")
        return _with_headers(wanted, all_headers, header_cache)
    except (ValueError, AttributeError, TypeError):
        # Rare: a WAL message's headers are no JSON object of strings (rows are written by
        # the outbox itself). Find it, and build the rest.
        wanted, all_headers = _readable_headers(wanted, unreadable)
        return _with_headers(wanted, all_headers, header_cache)


def _with_headers(
    wanted: list[tuple[Any, ...]],
    all_headers: list[Any],
    header_cache: dict[tuple[str, str], tuple[str, bytes]],
) -> list[ClaimedRow]:
    rows: list[ClaimedRow] = []
    append = rows.append
    cache_get = header_cache.get
    for values, headers in zip(wanted, all_headers, strict=True):
        pairs = []
        for item in headers.items():
            pair = cache_get(item)
            if pair is None:
                name, value = item
                pair = (name, value.encode())
                if name not in _UNIQUE_HEADERS:
                    if len(header_cache) >= _HEADER_CACHE_SIZE:
                        header_cache.clear()
                    header_cache[item] = pair
            pairs.append(pair)
        row_id = values[0]
        if row_id < 0:
            append(MessageRow(row_id, values[1], values[2], pairs, values[4], 0, values[5]))
        else:
            append(ClaimedRow(row_id, values[1], values[2], pairs, values[4], 0))
    return rows


def _valid_headers(headers: object) -> bool:
    return isinstance(headers, dict) and all(
        isinstance(name, str) and isinstance(value, str) for name, value in headers.items()
    )


def _readable_headers(
    wanted: list[tuple[Any, ...]], unreadable: list[tuple[Message, str]]
) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """``wanted`` less the WAL messages whose headers are no JSON object of strings (sent
    to ``unreadable``), and the parsed headers of the rest."""
    kept: list[tuple[Any, ...]] = []
    parsed: list[Any] = []
    for values in wanted:
        try:
            headers = json.loads(values[3])
        except ValueError as error:
            headers, reason = None, f"headers: {describe_error(error, with_class=True)}"
        else:
            reason = "headers: not a JSON object of strings"
        if _valid_headers(headers) or values[0] > 0:  # a row's headers: written by the outbox
            kept.append(values)
            parsed.append(headers)
        else:
            unreadable.append((Message(-values[0], wal_message.PREFIX, values[5]), reason))
    return kept, parsed
