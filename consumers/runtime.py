"""The consumer loop: fetch, apply once through the inbox, dead-letter, then commit offsets.

A partition's records of a fetched batch are decoded first, then applied *optimistically*: one
transaction claims all their inbox rows in one statement (``claim_many``), runs the handlers of
the new ones in offset order without savepoints, and commits once. If a handler raises, that
transaction is rolled back; the records before the failing one are applied again without it,
in a fresh transaction, and the failing one is dead-lettered (permanent failure) or retried
alone with backoff (any other), exactly as if it had failed on its own. The rest of that batch
then runs in *careful* mode: per record a SAVEPOINT holding its inbox claim and its handler, so a
record that fails permanently rolls back only its own work. Either way the Kafka offset is
committed only after the database commit and after every dead letter of those records is
acknowledged, so a crash at any point leads to redelivery, which the inbox absorbs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers.app import ConsumerApp, Handler
from outboxkit.consumers.decoding import decode_record
from outboxkit.consumers.dlq import DeadLetter, DeadLetterPublisher
from outboxkit.consumers.errors import (
    Category,
    ConsumerError,
    NoHandlerError,
    classify,
    error_class,
    safe_message,
)
from outboxkit.consumers.inbox import claim, claim_many, purge_inbox
from outboxkit.consumers.metrics import Positions
from outboxkit.consumers.tracing import HandlerTelemetry, Transaction
from outboxkit.outbox.db import make_async_engine
from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

log = logging.getLogger("outboxkit.consumer")

POLL_TIMEOUT_MS = 500
PARTITIONS_AT_ONCE = 4  # below the engine pool (5 + 10 overflow), with room for retention
COMMIT_TIMEOUT_S = 30.0
# Careful mode commits after this many records: PostgreSQL keeps 64 subtransactions per backend
# in shared memory; beyond that every snapshot of every session consults pg_subtrans.
CAREFUL_CHUNK = 50
# Fetch defaults (a consumer option of the app or the caller wins). aiokafka buffers fetched
# data unparsed, about max_partition_fetch_bytes per assigned partition and never more than
# fetch_max_bytes per fetch response, and fetches a partition again only once its buffer is
# consumed: memory stays bounded whatever the backlog. Records are parsed max_batch at a time.
FETCH_DEFAULTS: dict[str, Any] = {
    "fetch_max_bytes": 16 * 1024 * 1024,
    "max_partition_fetch_bytes": 1024 * 1024,
}

# --------------------------------------------------------------------------------------------
# TEST-ONLY CRASH HOOK. With OUTBOXKIT_TEST_CRASH_AFTER_COMMIT=N the process SIGKILLs itself
# right after its Nth database commit and before the matching Kafka offset commit, so tests can
# prove that the inbox absorbs the redelivery. This is the only place that reads it.
CRASH_AFTER_COMMIT_ENV = "OUTBOXKIT_TEST_CRASH_AFTER_COMMIT"


def _crash_after_commit_setting() -> int:
    value = os.environ.get(CRASH_AFTER_COMMIT_ENV, "").strip()
    return int(value) if value.isdigit() else 0


def _crash_now(commits: int) -> None:
    print(f"outboxkit: test crash hook: SIGKILL after database commit {commits}", file=sys.stderr)
    os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------------------------


@dataclass
class Stats:
    """Counters of one runtime, logged when it stops."""

    received: int = 0
    applied: int = 0
    duplicates: int = 0
    unhandled: int = 0
    dead_lettered: int = 0
    retries: int = 0
    dlq_failures: int = 0
    db_commits: int = 0
    offset_commits: int = 0
    dead_lettered_by_class: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


@dataclass(frozen=True, slots=True)
class _Run:
    """A record ready to apply: its handler, event attributes and bound arguments."""

    handler: Handler
    source: str
    event_id: str
    arguments: dict[str, Any]
    record: ConsumerRecord
    event: CloudEvent


_SKIP = object()


@dataclass(slots=True)
class _Failure:
    """A failed attempt (decoding or the handler) of a record: its error and when."""

    error: BaseException
    at_ms: int
    at_monotonic: float

    @property
    def permanent(self) -> bool:
        return classify(self.error) is Category.PERMANENT


def _failure(error: BaseException) -> _Failure:
    return _Failure(error, _now_ms(), time.monotonic())


# What a record became before any database work: a handler to run, _SKIP, or a failure.
_Step = _Run | object | _Failure


@dataclass(slots=True)
class _ChunkOutcome:
    """``done`` records applied, skipped or to dead-letter; ``failure`` of the next one."""

    done: int
    letters: list[DeadLetter]
    failure: _Failure | None
    fell_back: bool = False


class _HandlerFailed(Exception):
    """A handler raised in an optimistic chunk: which record (index in the batch), and what."""

    def __init__(self, index: int, error: BaseException, whole_batch: bool = False) -> None:
        super().__init__(index)
        self.index = index
        self.error = error
        # A batch handler raised for several records at once: the culprit is unknown.
        self.whole_batch = whole_batch


def _handler_calls(runs: list[tuple[int, _Run]]) -> list[list[tuple[int, _Run]]]:
    """Group the runs into handler calls, in order: consecutive runs of one batch handler
    form one call, every other run is a call of its own."""
    calls: list[list[tuple[int, _Run]]] = []
    for index, run in runs:
        previous = calls[-1][-1][1] if calls else None
        if run.handler.batch and previous is not None and previous.handler is run.handler:
            calls[-1].append((index, run))
        else:
            calls.append([(index, run)])
    return calls


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _describe(partitions: Iterable[TopicPartition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ", ".join(f"{t}{sorted(p)}" for t, p in sorted(by_topic.items())) or "none"


def _blocks(step: _Step) -> bool:
    """Whether a record's step stops an optimistic chunk: a failure that is to be retried."""
    return isinstance(step, _Failure) and not step.permanent


class ConsumerRuntime:
    """Runs a :class:`ConsumerApp` against Kafka and a database until :meth:`stop`.

    Several runtimes (processes) with the same group share the partitions. ``run`` returns
    after a stop request once in-flight work is committed (or abandoned, if it was waiting to
    retry) and the consumer has left the group.
    """

    def __init__(
        self,
        app: ConsumerApp,
        *,
        bootstrap: str,
        db_url: str | None = None,
        engine: AsyncEngine | None = None,
        group: str | None = None,
        consumer_options: dict[str, Any] | None = None,
        producer_options: dict[str, Any] | None = None,
    ) -> None:
        if (db_url is None) == (engine is None):
            raise ValueError("pass exactly one of db_url or engine")
        if not app.handlers:
            raise ConsumerError(f"consumer {app.name!r} has no handlers")
        self.app = app
        self.bootstrap = bootstrap
        self.group = group or app.group_id
        self.stats = Stats()
        self.assignment: set[TopicPartition] = set()
        self._db_url = db_url
        self._engine = engine
        self._consumer_options = {**app.consumer_options, **(consumer_options or {})}
        self._producer_options = {**app.producer_options, **(producer_options or {})}
        self._stopping = False
        self._wakeup = asyncio.Event()
        self._epoch = 0
        self._lock = asyncio.Lock()
        self._dlq_down = False
        self._commit_failing = False
        self._crash_after = _crash_after_commit_setting()
        self._sessions: async_sessionmaker[AsyncSession] | None = None
        self._dlq: DeadLetterPublisher | None = None
        self._offsets: dict[TopicPartition, int] = {}
        self._committer: asyncio.Task[None] | None = None
        # Partitions applied at once, each with a connection of its own (bounded by the pool).
        self._partition_slots = asyncio.Semaphore(PARTITIONS_AT_ONCE)
        # Telemetry hooks (.tracing, .metrics): spans and commit times per
        # handler call, and the next offset to handle per partition for the lag gauge.
        self.telemetry = HandlerTelemetry(self.group, app.name)
        self.positions = Positions()

    def stop(self) -> None:
        """Ask :meth:`run` to finish the work in hand and return."""
        self._stopping = True
        self._wakeup.set()

    async def run(self) -> Stats:
        """Consume until :meth:`stop`; return the counters."""
        engine = self._engine or make_async_engine(self._db_url or "")
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        consumer: AIOKafkaConsumer | None = None
        retention: asyncio.Task[None] | None = None
        started = False
        self._dlq = DeadLetterPublisher(
            self.bootstrap,
            self.group,
            topic_pattern=self.app.dlq_topic,
            timeout=self.app.dlq_timeout,
            producer_options=self._producer_options,
        )
        try:
            await self._check_database(engine)
            await self._dlq.start()
            consumer = self._new_consumer()
            self.positions.consumer = consumer
            consumer.subscribe(self.app.topics, listener=_Listener(self))
            log.info(
                "starting: consumer=%s group=%s topics=%s",
                self.app.name,
                self.group,
                ",".join(self.app.topics),
            )
            await consumer.start()
            started = True
            if self.app.retention_interval is not None:
                retention = asyncio.create_task(self._retention_loop(engine))
            await self._loop(consumer)
        finally:
            if retention is not None:
                retention.cancel()
                await asyncio.gather(retention, return_exceptions=True)
            if consumer is not None:
                await self._flush_commits()
                await consumer.stop()
            self.telemetry.forget()
            self.positions.consumer = None
            self.positions.revoked()
            await self._dlq.stop()
            if self._engine is None:
                await engine.dispose()
            if started:
                log.info("stopped: %s", self.stats)
        return self.stats

    def _new_consumer(self) -> AIOKafkaConsumer:
        options: dict[str, Any] = {
            "client_id": f"outboxkit-{self.app.name}",
            "auto_offset_reset": "earliest",
            "max_poll_records": self.app.max_batch,
            **FETCH_DEFAULTS,
        }
        options.update(self._consumer_options)
        options.update(group_id=self.group, enable_auto_commit=False)
        return AIOKafkaConsumer(bootstrap_servers=self.bootstrap, **options)

    async def _check_database(self, engine: AsyncEngine) -> None:
        async with engine.connect() as connection:
            present = await connection.run_sync(
                lambda sync: inspect(sync).has_table("inbox_events")
            )
        if not present:
            raise ConsumerError("table inbox_events is missing: run 'outboxkit migrate' first")

    async def _loop(self, consumer: AIOKafkaConsumer) -> None:
        while not self._stopping:
            epoch = self._epoch
            self._wakeup.clear()
            if self._stopping:
                break
            batch = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS)
            await self.positions.fetched(consumer, batch)
            if not batch:
                continue
            async with self._lock:
                # Partitions are independent: each one's records go in order through one
                # transaction at a time, while the others decode or wait on the database.
                await asyncio.gather(
                    *(
                        self._handle_partition(consumer, tp, records, epoch)
                        for tp, records in batch.items()
                        if tp in consumer.assignment()
                    )
                )

    async def _handle_partition(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        records: Sequence[ConsumerRecord],
        epoch: int,
    ) -> None:
        handled = 0
        async with self._partition_slots:
            if self._current(epoch):
                self.stats.received += len(records)
                handled = await self._process_partition(consumer, tp, records, epoch)
        if handled < len(records) and not self._stopping:
            self._rewind(consumer, tp, records[handled].offset)

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
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        records: Sequence[ConsumerRecord],
        epoch: int,
    ) -> int:
        """Apply one partition's records of a batch; return how many were handled."""
        steps = [self._step(record) for record in records]
        careful = False
        index = 0
        while index < len(records) and self._current(epoch):
            if careful:
                outcome = await self._run_careful(records, steps, index)
            else:
                outcome = await self._run_optimistic(records, steps, index)
                careful = outcome.fell_back
            if outcome.done:
                if not await self._deliver(outcome.letters, epoch):
                    return index
                self._commit(consumer, tp, records[index + outcome.done - 1].offset + 1)
                index += outcome.done
            if outcome.failure is None:
                continue
            record = records[index]
            result = await self._retry_alone(record, outcome.failure, epoch)
            if result is None:
                return index  # abandoned: revoked or stopping; the record will be redelivered
            if result is not _SKIP and not await self._deliver([result], epoch):
                return index
            self._commit(consumer, tp, record.offset + 1)
            index += 1
        return index

    def _prepare(self, record: ConsumerRecord) -> _Run | object:
        """Decode a record and bind its handler's arguments; ``_SKIP`` if no handler takes it.

        Raises a permanent error for an undecodable record, invalid data, or an unhandled type
        when those are dead-lettered.
        """
        event = decode_record(record.headers, record.value)
        handler = self.app.handler_for(record.topic, event.get_type())
        if handler is None:
            if self.app.unhandled == "skip":
                return _SKIP
            raise NoHandlerError(f"no handler for this event type on topic {record.topic!r}")
        return _Run(
            handler, event.get_source(), event.get_id(), handler.bind(event, record), record, event
        )

    def _step(self, record: ConsumerRecord) -> _Step:
        """:meth:`_prepare`, with a failure returned instead of raised."""
        try:
            return self._prepare(record)
        except Exception as error:
            return _failure(error)

    async def _apply(
        self, session: AsyncSession, run: _Run, calls: Transaction, attempt: int = 1
    ) -> bool:
        """Claim the event and run its handler; ``False`` if it was a duplicate."""
        if not await claim(session, self.app.name, run.source, run.event_id):
            return False
        with calls.call(run.record, run.event, attempt):
            await run.handler.call(session, run.arguments)
        return True

    async def _run_optimistic(
        self, records: Sequence[ConsumerRecord], steps: list[_Step], start: int
    ) -> _ChunkOutcome:
        """Apply ``records[start:]`` in one transaction without savepoints, up to a failure.

        The chunk ends before the first record whose decoding failed other than permanently
        (it takes the retry path). When a handler raises, everything is rolled back and the
        records before it are applied again without it; it is then dead-lettered or returned
        as the failure to retry, and ``fell_back`` asks for careful mode for the rest.
        """
        stop = start
        while stop < len(steps) and not _blocks(steps[stop]):
            stop += 1
        fell_back = False
        while True:
            try:
                await self._apply_optimistic(steps, start, stop)
            except _HandlerFailed as failed:
                # That was the failing record's first attempt. The ones before it succeeded
                # but were rolled back with it: they go again, with arguments built afresh,
                # since a handler may have changed the objects it was given.
                fell_back = True
                if not failed.whole_batch:
                    steps[failed.index] = _failure(failed.error)
                for i in range(start, failed.index):
                    if isinstance(steps[i], _Run):
                        steps[i] = self._step(records[i])
                blocking = (i for i in range(start, failed.index) if _blocks(steps[i]))
                stop = next(blocking, failed.index)
                continue
            except Exception as error:
                # The transaction as a whole failed (claim, commit, lost connection): nothing
                # took effect. The first record is retried alone; the ones after it follow.
                return _ChunkOutcome(0, [], _failure(error), True)
            break
        letters = [
            self._permanent_letter(records[i], step)
            for i in range(start, stop)
            if isinstance(step := steps[i], _Failure)
        ]
        done, failure = stop - start, None
        if stop < len(steps) and isinstance(step := steps[stop], _Failure):
            if step.permanent:
                letters.append(self._permanent_letter(records[stop], step))
                done += 1
            else:
                failure = step
        return _ChunkOutcome(done, letters, failure, fell_back)

    async def _apply_optimistic(self, steps: list[_Step], start: int, stop: int) -> None:
        """One transaction: claim the events of ``steps[start:stop]`` at once, run handlers.

        Raises :class:`_HandlerFailed` (after the rollback) when a handler raises.
        """
        assert self._sessions is not None
        runs = [(i, step) for i in range(start, stop) if isinstance(step := steps[i], _Run)]
        unhandled = sum(1 for i in range(start, stop) if steps[i] is _SKIP)
        applied = 0
        if runs:
            failed: _HandlerFailed | None = None
            calls = self.telemetry.transaction()
            try:
                async with self._sessions() as session, session.begin():
                    fresh = await claim_many(
                        session, self.app.name, [(run.source, run.event_id) for _, run in runs]
                    )
                    todo = []
                    for i, run in runs:
                        key = (run.source, run.event_id)
                        if key not in fresh:
                            continue  # applied before, or earlier in this chunk
                        fresh.discard(key)
                        todo.append((i, run))
                    for group in _handler_calls(todo):
                        first_index, first = group[0]
                        try:
                            if len(group) == 1:
                                with calls.call(first.record, first.event, 1):
                                    await first.handler.call(session, first.arguments)
                            else:
                                with calls.call_batch([(r.record, r.event) for _, r in group]):
                                    arguments = [run.arguments for _, run in group]
                                    await first.handler.call_batch(session, arguments)
                        except Exception as error:
                            failed = _HandlerFailed(first_index, error, len(group) > 1)
                            raise failed from None
                        applied += len(group)
            except _HandlerFailed:
                calls.rolled_back()
                raise
            except Exception:
                calls.rolled_back()
                if failed is not None:
                    raise failed from None  # the rollback after the handler's error failed too
                raise
            calls.committed()
            self._after_db_commit()
        self.stats.applied += applied
        self.stats.duplicates += len(runs) - applied
        self.stats.unhandled += unhandled

    async def _run_careful(
        self, records: Sequence[ConsumerRecord], steps: list[_Step], start: int
    ) -> _ChunkOutcome:
        """Apply records in one transaction, a savepoint each, until one needs a retry."""
        assert self._sessions is not None
        done, applied, duplicates, unhandled = 0, 0, 0, 0
        letters: list[DeadLetter] = []
        failure: _Failure | None = None
        calls = self.telemetry.transaction()
        try:
            async with self._sessions() as session, session.begin():
                for index in range(start, min(len(records), start + CAREFUL_CHUNK)):
                    record, step = records[index], steps[index]
                    if isinstance(step, _Failure):
                        if not step.permanent:
                            failure = step
                            break
                        letters.append(self._permanent_letter(record, step))
                    elif step is _SKIP:
                        unhandled += 1
                    else:
                        assert isinstance(step, _Run)
                        try:
                            async with session.begin_nested():
                                fresh = await self._apply(session, step, calls)
                        except Exception as error:
                            if classify(error) is not Category.PERMANENT:
                                failure = _failure(error)
                                break
                            letters.append(self._permanent_letter(record, _failure(error)))
                        else:
                            applied += fresh
                            duplicates += not fresh
                    done += 1
        except Exception as error:
            # The transaction as a whole failed (commit, lost connection): nothing took effect.
            # The first record is retried alone; the ones after it follow once it passes. A
            # record's own error (e.g. the lost connection) says more than the failed commit.
            calls.rolled_back()
            return _ChunkOutcome(0, [], failure or _failure(error))
        calls.committed()
        if applied or duplicates:
            self._after_db_commit()
        self.stats.applied += applied
        self.stats.duplicates += duplicates
        self.stats.unhandled += unhandled
        return _ChunkOutcome(done, letters, failure)

    def _permanent_letter(self, record: ConsumerRecord, failure: _Failure) -> DeadLetter:
        return self._letter(record, "permanent", failure.error, 1, failure.at_ms, failure.at_ms)

    async def _retry_alone(
        self, record: ConsumerRecord, failure: _Failure, epoch: int
    ) -> DeadLetter | object | None:
        """Retry one record with backoff; ``_SKIP`` when done, a dead letter, or ``None``."""
        assert self._sessions is not None
        attempts, error = 1, failure.error
        first_ms = last_ms = failure.at_ms
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        log.warning(
            "partition %s[%d] blocked at offset %d by %s; retrying",
            record.topic,
            record.partition,
            record.offset,
            error_class(classify(error).value, error),
        )
        while True:
            delay = self.app.retry.next_delay(attempts, time.monotonic() - failure.at_monotonic)
            if delay is None:
                log.warning("gave up on %s after %d attempts", where, attempts)
                return self._letter(record, "exhausted", error, attempts, first_ms, last_ms)
            self.telemetry.retrying(record, attempts, error)
            if not await self._pause(delay, epoch):
                log.info("abandoned retry of %s (stopping or partitions revoked)", where)
                return None
            self.stats.retries += 1
            calls = self.telemetry.transaction()
            try:
                step = self._prepare(record)
                if step is _SKIP:
                    self.stats.unhandled += 1
                    return _SKIP
                assert isinstance(step, _Run)
                async with self._sessions() as session, session.begin():
                    fresh = await self._apply(session, step, calls, attempts + 1)
            except Exception as next_error:
                calls.rolled_back()
                attempts, error, last_ms = attempts + 1, next_error, _now_ms()
                if classify(error) is Category.PERMANENT:
                    return self._letter(record, "permanent", error, attempts, first_ms, last_ms)
                continue
            calls.committed()
            self._after_db_commit()
            self.stats.applied += fresh
            self.stats.duplicates += not fresh
            log.info("partition %s[%d] unblocked", record.topic, record.partition)
            return _SKIP

    def _after_db_commit(self) -> None:
        self.stats.db_commits += 1
        if self._crash_after and self.stats.db_commits >= self._crash_after:
            _crash_now(self.stats.db_commits)  # test-only, see the hook at the top

    async def _pause(self, delay: float, epoch: int) -> bool:
        """Sleep up to ``delay`` seconds; ``False`` if work must be abandoned meanwhile."""
        if not self._current(epoch):
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), delay)
        return self._current(epoch)

    async def _deliver(self, letters: list[DeadLetter], epoch: int) -> bool:
        """Dead-letter ``letters``, retrying while the topic is unreachable.

        ``False`` when given up because of a stop or a revocation; nothing may be committed then.
        """
        if not letters:
            return True
        assert self._dlq is not None
        failures = 0
        while True:
            try:
                await self._dlq.publish(letters)
            except (KafkaError, TimeoutError, OSError) as error:
                failures += 1
                self.stats.dlq_failures += 1
                if not self._dlq_down:
                    self._dlq_down = True
                    log.error(
                        "dead-letter topic unreachable (%s); retrying, offsets not committed",
                        type(error).__name__,
                    )
                if not await self._pause(self.app.dlq_retry.delay(failures), epoch):
                    return False
                continue
            if self._dlq_down:
                self._dlq_down = False
                log.info("dead-letter topic reachable again")
            self.stats.dead_lettered += len(letters)
            for letter in letters:
                by_class = self.stats.dead_lettered_by_class
                by_class[letter.error_class] = by_class.get(letter.error_class, 0) + 1
            listed = ", ".join(f"@{x.offset} {x.error_class}" for x in letters[:10])
            more = f" and {len(letters) - 10} more" if len(letters) > 10 else ""
            log.warning(
                "dead-lettered %d record(s) of %s[%d]: %s%s",
                len(letters),
                letters[0].topic,
                letters[0].partition,
                listed,
                more,
            )
            return True

    def _commit(self, consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> None:
        """Have ``tp``'s ``offset`` committed in the background, with any others queued.

        The caller has committed the database transaction and delivered the dead letters of
        everything before ``offset``. One commit request is in flight at a time; offsets queued
        meanwhile go together in the next one, so the chunks never wait for the broker's
        answer (a few ms). A revocation and the shutdown wait for the queue to drain.
        """
        self._offsets[tp] = offset
        self.positions.handled(tp, offset)
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_queued(consumer))

    async def _commit_queued(self, consumer: AIOKafkaConsumer) -> None:
        while self._offsets:
            offsets, self._offsets = self._offsets, {}
            await self._commit_now(consumer, offsets)

    async def _flush_commits(self) -> None:
        """Wait until every queued offset is committed (or its commit failed)."""
        if self._committer is not None:
            await self._committer

    async def _commit_now(
        self, consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]
    ) -> None:
        try:
            await asyncio.wait_for(consumer.commit(offsets), COMMIT_TIMEOUT_S)
        except (CommitFailedError, IllegalStateError) as error:
            # The partition moved to another member; it resumes from the last committed offset
            # and the inbox skips what this process already applied.
            log.info("offset commit for %s refused: %s", _describe(offsets), type(error).__name__)
            return
        except (KafkaError, TimeoutError) as error:
            if not self._commit_failing:
                self._commit_failing = True
                log.warning("offset commits failing (%s); will retry", type(error).__name__)
            return
        self.stats.offset_commits += 1
        if self._commit_failing:
            self._commit_failing = False
            log.info("offset commits succeed again")

    def _letter(
        self,
        record: ConsumerRecord,
        category: str,
        error: BaseException,
        attempts: int,
        first_ms: int,
        last_ms: int,
    ) -> DeadLetter:
        self.telemetry.dead_lettered(record, attempts, error, error_class(category, error))
        return DeadLetter(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            timestamp=record.timestamp,
            key=record.key,
            value=record.value,
            headers=tuple(record.headers or ()),
            error_class=error_class(category, error),
            error_message=safe_message(error),
            attempts=attempts,
            first_failure_ms=first_ms,
            last_failure_ms=last_ms,
        )

    async def _retention_loop(self, engine: AsyncEngine) -> None:
        assert self.app.retention_interval is not None
        interval = self.app.retention_interval.total_seconds()
        failing = False
        while True:
            try:
                removed = await purge_inbox(
                    engine, consumer=self.app.name, older_than=self.app.inbox_retention
                )
            except Exception as error:
                if not failing:
                    failing = True
                    log.warning("inbox retention failed (%s); will retry", type(error).__name__)
            else:
                if failing:
                    failing = False
                    log.info("inbox retention works again")
                if removed:
                    log.info("inbox retention removed %d entries", removed)
            await asyncio.sleep(interval)

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        # Stop retries and later partitions of the batch, then wait for the transaction in
        # hand and the offset commit in flight: whatever was applied has its offset committed
        # before the rebalance proceeds.
        self._epoch += 1
        self._wakeup.set()
        async with self._lock:
            await self._flush_commits()
            self.assignment = set()
            self.telemetry.forget(revoked)
            self.positions.revoked(revoked)
        if revoked:
            log.info("partitions revoked: %s", _describe(revoked))

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        self.assignment = set(assigned)
        log.info("partitions assigned: %s", _describe(assigned))


class _Listener(ConsumerRebalanceListener):
    def __init__(self, runtime: ConsumerRuntime) -> None:
        self._runtime = runtime

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._runtime._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._runtime._on_assigned(assigned)


async def serve(runtime: ConsumerRuntime) -> Stats:
    """Run ``runtime`` until SIGTERM or SIGINT, then drain and return its counters."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, runtime.stop)
    try:
        return await runtime.run()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
