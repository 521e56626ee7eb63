"""The consumer runtime: its lifecycle, the fetch loop, the fan-out to partitions, rebalances.

Each fetched batch is split by partition, and each partition's records go to a worker task of
their own while that partition is paused, so the fetch loop goes on for the others: a partition
that retries, waits or hangs never delays another. A partition's records go through the inbox in
order (:mod:`.apply`), their dead letters are delivered (:mod:`.dlq`), then their offset is
committed (:mod:`.offsets`), always in that order, so a crash at any point leads to redelivery,
which the inbox absorbs. See docs/consumers.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalStateError
from outboxkit.consumers.app import ConsumerApp
from outboxkit.consumers.apply import Applier, HandlerInterrupt, _Full, _Head, _Hold
from outboxkit.consumers.dlq import DeadLetterDelivery, DeadLetterPublisher
from outboxkit.consumers.errors import ConsumerError, StopTimeoutError, unreachable
from outboxkit.consumers.in_flight import HandlerCall
from outboxkit.consumers.inbox import retain_inbox
from outboxkit.consumers.metrics import ConsumerStats, Positions
from outboxkit.consumers.offsets import OffsetCommitter, describe_partitions
from outboxkit.consumers.sequences import BatchView, SequenceKeeper
from outboxkit.consumers.signals import StopSignals
from outboxkit.consumers.stall import DEFAULT_STALL_AFTER_S, GroupStallWatch
from outboxkit.consumers.tables import inbox_windows
from outboxkit.consumers.tracing import HandlerTelemetry
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.health import DependencyHealth
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.readiness import Readiness
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

log = logging.getLogger("outboxkit.consumer")

POLL_TIMEOUT_MS = 500
DEFAULT_STOP_TIMEOUT_S = 30.0
STOP_CANCEL_WAIT_S = 5.0  # after the stop deadline: for cancelled handlers to roll back
SEQUENCE_SWEEP_S = 2.0  # how often released keys of idle partitions are looked for
PARTITIONS_AT_ONCE = 4  # below the engine pool (5 + 10 overflow), with room for retention
# Fetch defaults (a consumer option of the app or the caller wins). aiokafka buffers fetched
# data unparsed, about max_partition_fetch_bytes per assigned partition and never more than
# fetch_max_bytes per fetch response, and fetches a partition again only once its buffer is
# consumed: memory stays bounded whatever the backlog. Records are parsed max_batch at a time.
# aiokafka sends one fetch at a time per broker; while it long-polls for partitions that are
# caught up, a partition resumed by its worker waits for that poll to end before it is fetched
# again. With aiokafka's 500 ms that wait stalled every busy partition as soon as one partition
# of the same broker had nothing new (a quarter of the throughput, measured). An idle consumer
# pays for the shorter wait with up to 20 empty fetches a second per broker.
FETCH_DEFAULTS: dict[str, Any] = {
    "fetch_max_bytes": 16 * 1024 * 1024,
    "max_partition_fetch_bytes": 1024 * 1024,
    "fetch_max_wait_ms": 50,
}


class ConsumerRuntime:
    """Runs a :class:`ConsumerApp` against Kafka and a database.

    Pass exactly one of ``engine`` (shared, left open) or ``db_url`` (an engine of its own).
    :meth:`start` connects and begins consuming in a background task; :meth:`stop` finishes
    the work in hand, commits, leaves the group and closes (a record waiting to be retried is
    abandoned and redelivered later); :meth:`run` is start, then wait until stopped, raising
    the error the work failed with; ``async with`` is start/stop. ``stats`` has the counters.
    Several runtimes (processes) with the same group share the partitions.

    ``on_db_commit`` is called right after each database commit that claimed events (the
    ``db_commits`` counter), before their offsets are committed: tests use it to crash there.

    ``stop_timeout_s``: how long :meth:`stop` waits for the work in hand. Past it, it logs the
    handler calls still running (type, handler, topic, partition, offset; never a payload),
    cancels them, closes, and raises :class:`StopTimeoutError`.
    """

    def __init__(
        self,
        app: ConsumerApp,
        *,
        kafka: KafkaSettings,
        engine: AsyncEngine | None = None,
        db_url: str | None = None,
        group: str | None = None,
        consumer_options: dict[str, Any] | None = None,
        producer_options: dict[str, Any] | None = None,
        on_db_commit: Callable[[], None] | None = None,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        stall_after_s: float = DEFAULT_STALL_AFTER_S,
    ) -> None:
        if (db_url is None) == (engine is None):
            raise ValueError("pass exactly one of db_url or engine")
        if stop_timeout_s <= 0:
            raise ValueError("stop_timeout_s must be positive")
        if not app.handlers:
            raise ConsumerError(f"consumer {app.name!r} has no handlers")
        self.app = app
        self.kafka = kafka
        self.group = group or app.group_id
        self.stats = ConsumerStats()
        self.stop_timeout_s = stop_timeout_s
        self.assignment: set[TopicPartition] = set()
        self._db_url = db_url
        self._engine = engine
        self._consumer_options = {**app.consumer_options, **(consumer_options or {})}
        self._producer_options = {**app.producer_options, **(producer_options or {})}
        self._on_db_commit = on_db_commit
        self._stopping = False
        self._wakeup = asyncio.Event()
        self._epoch = 0
        self._workers: dict[TopicPartition, asyncio.Task[None]] = {}
        self._failure: BaseException | None = None
        self._lifecycle = asyncio.Lock()  # start and stop/close, one at a time
        self._opened = False
        self._closed = False
        self._running: asyncio.Task[None] | None = None
        self._owned_engine: AsyncEngine | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._started = False
        self._retention: asyncio.Task[None] | None = None
        self._applier: Applier | None = None
        self._sequences: SequenceKeeper | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._dlq: DeadLetterDelivery | None = None
        self._offsets: OffsetCommitter | None = None
        # Partitions applied at once, each with a connection of its own (bounded by the pool).
        self._partition_slots = asyncio.Semaphore(PARTITIONS_AT_ONCE)
        # Telemetry hooks (.tracing, .metrics): spans and commit times per
        # handler call, and the next offset to handle per partition for the lag gauge.
        self.telemetry = HandlerTelemetry(self.group, app.name)
        self.positions = Positions()
        # What /readyz answers (outbox/metrics_server.py): ready once in the group (with any
        # number of partitions) while periodic database and broker round trips work.
        self.readiness = Readiness(assigned_what="partitions", min_assigned=0)
        # A partition lagging with no commit for stall_after_s: /readyz 503 and a log line.
        self.stall = GroupStallWatch(self.positions, self.readiness, stall_after_s)
        self._stall_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect to the database and Kafka, join the group, and consume in the background.

        Raises :class:`ConsumerError` when the inbox table is missing, or the client's error
        when a dependency is unreachable; nothing stays open then, and after an unreachable
        dependency ``start()`` may be called again (:func:`serve` waits that way).
        """
        async with self._lifecycle:
            if self._opened or self._closed:
                raise ConsumerError("a ConsumerRuntime starts once")
            self._opened = True
            try:
                await self._open()
            except BaseException as error:
                await self._close()
                if unreachable(error):
                    self._rearm()  # nothing was started: start() may be tried again
                raise

    def _rearm(self) -> None:
        """Forget a start that failed before anything ran, so that start() can be tried again."""
        self._opened = self._closed = self._stopping = False
        self._owned_engine = None
        self._consumer = self._offsets = self._dlq = None

    async def _open(self) -> None:
        if self._engine is None:
            self._owned_engine = make_async_engine(self._db_url or "")
        engine = self._engine or self._owned_engine
        assert engine is not None
        publisher = DeadLetterPublisher(
            self.kafka,
            self.group,
            topic_pattern=self.app.dlq_topic,
            timeout_s=self.app.dlq_timeout_s,
            producer_options=self._producer_options,
        )
        self._dlq = DeadLetterDelivery(publisher, self.app.dlq_retry, self.stats)
        with self.readiness.checking("database"):
            await self._check_database(engine)
        self._applier = Applier(
            self.app,
            async_sessionmaker(engine, expire_on_commit=False),
            self.telemetry,
            self.stats,
            self._on_db_commit,
        )
        if self.app.sequenced:
            self._sequences = SequenceKeeper(
                self._applier, async_sessionmaker(engine, expire_on_commit=False), self._dlq
            )
        with self.readiness.checking("broker"):
            await publisher.start()
            consumer = self._consumer = self._new_consumer()
            self._offsets = OffsetCommitter(consumer, self.stats)
            self.positions.consumer = consumer
            consumer.subscribe(self.app.topics, listener=_Listener(self))
            log.info(
                "starting: consumer=%s group=%s topics=%s",
                self.app.name,
                self.group,
                ",".join(self.app.topics),
            )
            await consumer.start()
        self._started = True
        self.readiness.start({"database": lambda: _ping(engine), "broker": consumer.topics})
        self._stall_task = asyncio.create_task(self.stall.run(self._offsets.committed_at))
        if self.app.retention_interval_s is not None:
            self._retention = asyncio.create_task(
                retain_inbox(
                    engine,
                    consumer=self.app.name,
                    retention_s=self.app.inbox_retention_s,
                    interval_s=self.app.retention_interval_s,
                )
            )
        self._running = asyncio.create_task(self._loop(consumer))
        if self._sequences is not None:
            self._sweeper = asyncio.create_task(self._sweep_released(consumer))
        log.info("consumer %s started", self.app.name)

    async def stop(self) -> None:
        """Finish the work in hand, commit its offsets, leave the group and close; idempotent.

        An error the work failed with is logged here, and raised by :meth:`run`. Raises
        :class:`StopTimeoutError` when handlers were still running after ``stop_timeout_s``
        (they were cancelled, and the runtime closed).
        """
        self._stopping = True
        self._wake()
        async with self._lifecycle:
            if self._closed:
                return
            stuck = None
            if self._running is not None:
                done, _ = await asyncio.wait([self._running], timeout=self.stop_timeout_s)
                if not done:
                    stuck = self._give_up_on_work()
                    await asyncio.wait(
                        [self._running, *self._workers.values()], timeout=STOP_CANCEL_WAIT_S
                    )
                elif not self._running.cancelled() and self._running.exception() is not None:
                    error = self._running.exception()
                    log.error("the consumer had stopped on %s", type(error).__name__)
            await self._close()
        if stuck is not None:
            raise StopTimeoutError(stuck)

    def blocked_keys(self) -> tuple[int, int] | None:
        """(blocked keys, held records) of this consumer as last read (every few seconds);
        ``None`` when no handler uses ``on_dead_letter="sequence"``."""
        return None if self._sequences is None else self._sequences.summary

    def in_flight(self) -> list[HandlerCall]:
        """The handler calls running right now, oldest first (safe to call from any thread)."""
        return [] if self._applier is None else self._applier.in_flight.calls()

    def _give_up_on_work(self) -> str:
        """Log what is still running at the stop deadline, and cancel it; return a summary."""
        calls = self.in_flight()
        if calls:
            for call in calls:
                log.error("stop deadline passed: %s", call.describe())
            summary = f"{len(calls)} handler call(s) still running: {calls[0].describe()}"
        else:
            summary = "no handler running (waiting on the database or Kafka)"
        log.error(
            "stop deadline of %g s passed with work still running; cancelling it (%s)",
            self.stop_timeout_s,
            summary,
        )
        assert self._running is not None
        self._running.cancel()
        for worker in self._workers.values():
            worker.cancel()
        return f"stop deadline of {self.stop_timeout_s:g} s passed: {summary}"

    async def run(self) -> None:
        """Start (unless started already), then wait until :meth:`stop` is done; raise what the
        work failed with."""
        if self._running is None:
            await self.start()
        running = self._running
        assert running is not None
        try:
            await asyncio.wait([running])
        except asyncio.CancelledError:
            running.cancel()
            for worker in self._workers.values():
                worker.cancel()
            await asyncio.wait([running, *self._workers.values()])
            async with self._lifecycle:
                await self._close()
            raise
        async with self._lifecycle:  # waits for a stop() under way to finish
            await self._close()
        if not running.cancelled() and (error := running.exception()) is not None:
            raise error

    async def __aenter__(self) -> ConsumerRuntime:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _close(self) -> None:
        """Release whatever :meth:`_open` acquired, once; the caller holds ``_lifecycle``."""
        if self._closed:
            return
        self._closed = True
        self._stopping = True
        await self.readiness.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for task in (self._retention, self._stall_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._consumer is not None:
            if self._offsets is not None:
                await self._offsets.flush()
            await self._consumer.stop()
        self.telemetry.forget()
        self.positions.consumer = None
        self.positions.revoked()
        if self._dlq is not None:
            await self._dlq.publisher.stop()
        if self._owned_engine is not None:
            await self._owned_engine.dispose()
        if self._started:
            log.info("stopped: %s", self.stats)

    def _new_consumer(self) -> AIOKafkaConsumer:
        options: dict[str, Any] = {
            **self.kafka.client_options(f"outboxkit-{self.app.name}"),
            "auto_offset_reset": "earliest",
            "max_poll_records": self.app.max_batch,
            **FETCH_DEFAULTS,
        }
        options.update(self._consumer_options)
        options.update(group_id=self.group, enable_auto_commit=False)
        return AIOKafkaConsumer(**options)

    async def _check_database(self, engine: AsyncEngine) -> None:
        # inbox_windows came with the partitioned inbox (0016): without it, this version's
        # claims would fail on every batch.
        needed = ("inbox_events", inbox_windows.name)
        async with engine.connect() as connection:
            present = await connection.run_sync(
                lambda sync: [inspect(sync).has_table(name) for name in needed]
            )
        missing = [name for name, there in zip(needed, present, strict=True) if not there]
        if missing:
            raise ConsumerError(f"table {missing[0]} is missing: run 'outboxkit migrate' first")

    async def _loop(self, consumer: AIOKafkaConsumer) -> None:
        """Fetch and hand each partition's records to a worker task of its own.

        A partition is paused while its worker has records in hand (applying, retrying,
        waiting for the dead-letter topic), so the fetch loop goes on for the others and a
        stuck partition delays nobody. The worker resumes it when done.
        """
        try:
            while not self._stopping and self._failure is None:
                epoch = self._epoch
                batch = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS)
                await self.positions.fetched(consumer, batch)
                for tp, records in batch.items():
                    self._dispatch(consumer, tp, records, epoch)
        finally:
            while self._workers:
                await asyncio.wait(list(self._workers.values()))
        if self._failure is not None:
            raise self._failure

    def _dispatch(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        records: Sequence[ConsumerRecord],
        epoch: int,
    ) -> None:
        if self._stopping:
            return
        if epoch != self._epoch or tp in self._workers or tp not in consumer.assignment():
            self._rewind(consumer, tp, records[0].offset)
            return
        consumer.pause(tp)
        worker = asyncio.create_task(self._work(consumer, tp, records, epoch))
        self._workers[tp] = worker
        worker.add_done_callback(functools.partial(self._worker_done, tp))

    def _worker_done(self, tp: TopicPartition, worker: asyncio.Task[None]) -> None:
        if self._workers.get(tp) is worker:
            del self._workers[tp]
        if not worker.cancelled() and (error := worker.exception()) is not None:
            if self._failure is None:
                self._failure = error
            self._wake()

    async def _work(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        records: Sequence[ConsumerRecord],
        epoch: int,
    ) -> None:
        """Apply ``tp``'s records, then resume fetching it (from the first one not handled)."""
        handled = 0
        try:
            async with self._partition_slots:
                if self._current(epoch):
                    self.stats.received += len(records)
                    handled = await self._process_partition(tp, records, epoch)
        except HandlerInterrupt:
            self._stopping = True  # like a stop: every partition ends its work, nothing resumes
            self._wake()
            raise
        finally:
            if not self._stopping:
                if handled < len(records):
                    self._rewind(consumer, tp, records[handled].offset)
                with contextlib.suppress(IllegalStateError):
                    consumer.resume(tp)

    def _rewind(self, consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` again from ``offset``, the first record of a batch left unhandled.

        ``getmany`` moved the position past every record it returned. A rebalance that
        completed while it waited may have handed the partition back to this member with the
        position restarted from the committed offset, and the records of this batch were then
        fetched from there: dropping them without a seek would skip them for good. (When the
        partition is revoked after all, the next assignment resets the position anyway.)
        """
        with contextlib.suppress(IllegalStateError):
            consumer.seek(tp, offset)

    def _current(self, epoch: int) -> bool:
        return not self._stopping and self._epoch == epoch

    async def _process_partition(
        self, tp: TopicPartition, records: Sequence[ConsumerRecord], epoch: int
    ) -> int:
        """Apply one partition's records of a batch; return how many were handled."""
        applier, dlq = self._applier, self._dlq
        assert applier is not None and dlq is not None

        async def pause(delay: float) -> bool:
            # No connection is held while waiting: let another partition have the slot.
            self._partition_slots.release()
            try:
                return await self._pause(delay, epoch)
            finally:
                await self._partition_slots.acquire()

        steps = applier.steps(records)
        view = None if self._sequences is None else await self._sequences.mark(records, steps)
        careful = False
        index = 0
        while index < len(records) and self._current(epoch):
            if view is not None and isinstance(steps[index], _Head | _Full):
                handled = await self._blocked_key(tp, view, index, pause)
                if handled is None:
                    return index
                index += handled
                continue
            if careful:
                outcome = await applier.run_careful(records, steps, index)
            else:
                outcome = await applier.run_optimistic(records, steps, index)
                careful = outcome.fell_back
            if outcome.done:
                if view is not None:
                    await view.blocked_by(outcome.letters, index + outcome.done)
                if not await dlq.deliver(outcome.letters, pause):
                    return index
                self._commit(tp, records[index + outcome.done - 1].offset + 1)
                index += outcome.done
            if outcome.failure is None:
                continue
            record = records[index]
            if view is not None and isinstance(steps[index], _Hold):
                # The chunk failed as a whole (the database): store this one alone, held.
                if not await self._hold_alone(tp, view, index, pause):
                    return index
                index += 1
                continue
            letters = await applier.retry_alone(record, outcome.failure, pause)
            if letters is None:
                return index  # abandoned: revoked or stopping; the record will be redelivered
            if view is not None:
                await view.blocked_by(letters, index + 1)
            if not await dlq.deliver(letters, pause):
                return index
            self._commit(tp, record.offset + 1)
            index += 1
        return index

    async def _blocked_key(
        self,
        tp: TopicPartition,
        view: BatchView,
        index: int,
        pause: Callable[[float], Awaitable[bool]],
    ) -> int | None:
        """Handle the record at ``index`` of a blocked key on its own: a head arriving again
        (applied; its success releases the key, whose held records are applied at once) or a
        record waiting for room among the held ones. Returns how many records it handled (0:
        the record is to be handled again, its key unblocked meanwhile), ``None`` if abandoned.
        """
        applier, dlq, keeper = self._applier, self._dlq, self._sequences
        assert applier is not None and dlq is not None and keeper is not None
        step = view.steps[index]
        record = view.records[index]
        if isinstance(step, _Full):
            log.warning(
                "partition %s[%d] waits at offset %d: the held records of a blocked key are "
                "at their bound (max_held_per_key=%d, max_held=%d)",
                tp.topic,
                tp.partition,
                record.offset,
                self.app.max_held_per_key,
                self.app.max_held,
            )
            waits = 0
            while not await keeper.room(step.record.topic, step.key_hash):
                # This worker owns the partition: a key an operator released is drained here.
                drained = await keeper.drain(step.record.topic, step.key_hash, pause)
                if drained is True:
                    view.released(step.record.topic, step.key_hash, index)
                    return 0
                if drained is None and not self._current(self._epoch):
                    return None
                waits += 1
                if not await pause(self.app.retry.delay(waits)):
                    return None
            view.steps[index] = view.held(applier.steps([record])[0], record, step.key_hash)
            return 1 if await self._hold_alone(tp, view, index, pause) else None
        assert isinstance(step, _Head)
        letters = await applier.apply_alone(record, pause, also=keeper.release_head(step))
        if letters is None or not await dlq.deliver(letters, pause):
            return None
        self._commit(tp, record.offset + 1)
        if letters:
            return 1  # the head failed again: its key stays blocked
        log.info("the head of a blocked key of %s arrived again and was applied", tp.topic)
        drained = await keeper.drain(step.record.topic, step.key_hash, pause)
        if drained is True:
            view.released(step.record.topic, step.key_hash, index + 1)
        return 1

    async def _hold_alone(
        self,
        tp: TopicPartition,
        view: BatchView,
        index: int,
        pause: Callable[[float], Awaitable[bool]],
    ) -> bool:
        """Store the held record at ``index`` in a transaction of its own, retrying with
        backoff while the database fails; ``False``: abandoned (stop or revocation)."""
        keeper = self._sequences
        assert keeper is not None
        step = view.steps[index]
        assert isinstance(step, _Hold)
        failures = 0
        while True:
            try:
                await keeper.hold_alone(step)
            except Exception as error:
                failures += 1
                log.warning(
                    "could not hold %s[%d]@%d (%s); retrying",
                    tp.topic,
                    tp.partition,
                    step.record.offset,
                    type(error).__name__,
                )
                if not await pause(self.app.retry.delay(failures)):
                    return False
                continue
            self.stats.held += 1
            self._commit(tp, step.record.offset + 1)
            return True

    async def _sweep_released(self, consumer: AIOKafkaConsumer) -> None:
        """Drain the released keys of assigned partitions that no batch is working on (keys
        an operator skipped or released, or whose drain a stop or a crash interrupted)."""
        keeper = self._sequences
        assert keeper is not None
        failures = 0
        while not self._stopping:
            try:
                released = await keeper.released()
                await keeper.refresh_summary()
                failures = 0
            except Exception as error:  # the database is away: try again later
                failures += 1
                log.warning("could not read released keys (%s)", type(error).__name__)
                released = []
            for topic, partition, hashed in released:
                tp = TopicPartition(topic, partition)
                if tp in self._workers or tp not in consumer.assignment() or self._stopping:
                    continue
                consumer.pause(tp)
                worker = asyncio.create_task(self._drain_work(consumer, tp, hashed, self._epoch))
                self._workers[tp] = worker
                worker.add_done_callback(functools.partial(self._worker_done, tp))
            await asyncio.sleep(SEQUENCE_SWEEP_S * (1 + min(failures, 5)))

    async def _drain_work(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition, hashed: str, epoch: int
    ) -> None:
        keeper = self._sequences
        assert keeper is not None

        async def pause(delay: float) -> bool:
            self._partition_slots.release()
            try:
                return await self._pause(delay, epoch)
            finally:
                await self._partition_slots.acquire()

        try:
            async with self._partition_slots:
                if self._current(epoch):
                    await keeper.drain(tp.topic, hashed, pause)
        finally:
            if not self._stopping:
                with contextlib.suppress(IllegalStateError):
                    consumer.resume(tp)

    def _commit(self, tp: TopicPartition, offset: int) -> None:
        """Everything of ``tp`` before ``offset`` is done: commit it in the background."""
        assert self._offsets is not None
        self.positions.handled(tp, offset)
        self._offsets.commit(tp, offset)

    async def _pause(self, delay: float, epoch: int) -> bool:
        """Sleep up to ``delay`` seconds; ``False`` if work must be abandoned meanwhile."""
        if not self._current(epoch):
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), delay)
        return self._current(epoch)

    def _wake(self) -> None:
        """End every pause under way; later pauses wait on a fresh event."""
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        # Stop retries and the rest of every partition's records, then wait for the
        # transactions in hand and the offset commit in flight: whatever was applied has its
        # offset committed before the rebalance proceeds.
        self._epoch += 1
        self._wake()
        while self._workers:
            await asyncio.wait(list(self._workers.values()))
        if self._offsets is not None:
            await self._offsets.flush()
        self.assignment = set()
        self.telemetry.forget(revoked)
        self.positions.revoked(revoked)
        if revoked:
            log.info("partitions revoked: %s", describe_partitions(revoked))

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        self.assignment = set(assigned)
        if self._sequences is not None:
            self._sequences.assigned()
        self.readiness.mark_assigned(len(assigned))
        log.info("partitions assigned: %s", describe_partitions(assigned))


async def _ping(engine: AsyncEngine) -> None:
    async with engine.connect() as connection:
        await connection.execute(text("SELECT 1"))


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, runtime: ConsumerRuntime) -> None:
        self._runtime = runtime

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._runtime._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._runtime._on_assigned(assigned)


async def serve(runtime: ConsumerRuntime, signals: StopSignals | None = None) -> ConsumerStats:
    """Run ``runtime`` until SIGTERM or SIGINT, then drain and return its counters.

    ``signals``: handlers the caller installed first thing (default: installed here). A signal
    that came before this point means the runtime is not started at all. Raises
    :class:`StopTimeoutError` when the stop passed its deadline, or the error the work failed
    with.
    """
    signals = signals or StopSignals().install()
    if signals.requested:
        log.info("consumer %s: stop requested while starting up; not started", runtime.app.name)
        return runtime.stats
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    def request_stop() -> None:
        if not stopping:
            stopping.append(loop.create_task(runtime.stop()))

    def on_signal() -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing left to stop
            loop.call_soon_threadsafe(request_stop)

    signals.on_stop(on_signal)
    try:
        if await _start_when_reachable(runtime, signals):
            await runtime.run()
    finally:
        await asyncio.gather(*stopping)
    return runtime.stats


async def _start_when_reachable(runtime: ConsumerRuntime, signals: StopSignals) -> bool:
    """Start ``runtime``, waiting with backoff while the broker or the database is unreachable
    (one log line per cause, ``/readyz`` not ready meanwhile); False if stopped first."""
    health = DependencyHealth(f"consumer {runtime.app.name}: kafka or database", log=log)
    backoff = Backoff(base_s=0.5, cap_s=15.0, floor_s=0.1)
    while not signals.requested:
        try:
            await runtime.start()
        except Exception as error:
            if not unreachable(error):
                raise
            delay = backoff.delay(health.failed(error))
            deadline = asyncio.get_running_loop().time() + delay
            while not signals.requested and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(min(0.1, delay))
            continue
        health.succeeded()
        return True
    log.info("consumer %s: stop requested while waiting to start; not started", runtime.app.name)
    return False
