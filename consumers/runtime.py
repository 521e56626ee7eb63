"""The consumer loop: fetch, apply once through the inbox, dead-letter, then commit offsets.

For each partition's records of a fetched batch, one database transaction holds a SAVEPOINT per
record: the inbox claim and the handler's work. A record that fails permanently rolls back its
savepoint and is dead-lettered; one that fails transiently ends the transaction there: what came
before it commits, and it is retried alone with backoff. The Kafka offset is committed only
after the database commit and after every dead letter of those records is acknowledged, so a
crash at any point leads to redelivery, which the inbox absorbs.
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
from dataclasses import dataclass, fields
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from consumers.app import ConsumerApp, Handler
from consumers.decoding import decode_record
from consumers.dlq import DeadLetter, DeadLetterPublisher
from consumers.errors import (
    Category,
    ConsumerError,
    NoHandlerError,
    classify,
    error_class,
    safe_message,
)
from consumers.inbox import claim, purge_inbox
from outbox.db import make_async_engine

log = logging.getLogger("outboxkit.consumer")

POLL_TIMEOUT_MS = 500
COMMIT_TIMEOUT_S = 30.0

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

    def __str__(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


@dataclass(frozen=True, slots=True)
class _Run:
    """A record ready to apply: its handler, event attributes and bound arguments."""

    handler: Handler
    source: str
    event_id: str
    arguments: dict[str, Any]


_SKIP = object()


@dataclass(slots=True)
class _Failure:
    error: BaseException
    at_ms: int
    at_monotonic: float


@dataclass(slots=True)
class _ChunkOutcome:
    done: int
    letters: list[DeadLetter]
    failure: _Failure | None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _describe(partitions: Iterable[TopicPartition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ", ".join(f"{t}{sorted(p)}" for t, p in sorted(by_topic.items())) or "none"


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
                await consumer.stop()
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
            if not batch:
                continue
            async with self._lock:
                for tp, records in batch.items():
                    # After a revocation the fetch positions restart from the committed
                    # offsets, so records of this (stale) batch come back if still ours.
                    if not self._current(epoch):
                        break
                    if tp not in consumer.assignment():
                        continue
                    self.stats.received += len(records)
                    await self._process_partition(consumer, tp, records, epoch)

    def _current(self, epoch: int) -> bool:
        return not self._stopping and self._epoch == epoch

    async def _process_partition(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        records: Sequence[ConsumerRecord],
        epoch: int,
    ) -> None:
        index = 0
        while index < len(records) and self._current(epoch):
            outcome = await self._run_chunk(records[index:])
            if outcome.done:
                if not await self._deliver(outcome.letters, epoch):
                    return
                await self._commit(consumer, tp, records[index + outcome.done - 1].offset + 1)
                index += outcome.done
            if outcome.failure is None:
                continue
            record = records[index]
            result = await self._retry_alone(record, outcome.failure, epoch)
            if result is None:
                return  # abandoned: revoked or stopping; the record will be redelivered
            if result is not _SKIP and not await self._deliver([result], epoch):
                return
            await self._commit(consumer, tp, record.offset + 1)
            index += 1

    def _prepare(self, record: ConsumerRecord) -> _Run | object:
        """Decode a record and bind its handler's arguments; ``_SKIP`` if no handler takes it.

        Raises a permanent error for an undecodable record, invalid data, or an unhandled type
        when those are dead-lettered.
        """
        event = decode_record(record.headers, record.key, record.value)
        handler = self.app.handler_for(record.topic, event.get_type())
        if handler is None:
            if self.app.unhandled == "skip":
                return _SKIP
            raise NoHandlerError(f"no handler for this event type on topic {record.topic!r}")
        return _Run(handler, event.get_source(), event.get_id(), handler.bind(event))

    async def _apply(self, session: AsyncSession, run: _Run) -> bool:
        """Claim the event and run its handler; ``False`` if it was a duplicate."""
        if not await claim(session, self.app.name, run.source, run.event_id):
            return False
        await run.handler.call(session, run.arguments)
        return True

    async def _run_chunk(self, records: Sequence[ConsumerRecord]) -> _ChunkOutcome:
        """Apply records in one transaction until the first one that needs a retry."""
        assert self._sessions is not None
        done, applied, duplicates, unhandled = 0, 0, 0, 0
        letters: list[DeadLetter] = []
        failure: _Failure | None = None
        try:
            async with self._sessions() as session, session.begin():
                for record in records:
                    try:
                        step = self._prepare(record)
                        if step is _SKIP:
                            unhandled += 1
                        else:
                            assert isinstance(step, _Run)
                            async with session.begin_nested():
                                fresh = await self._apply(session, step)
                            applied += fresh
                            duplicates += not fresh
                    except Exception as error:
                        if classify(error) is not Category.PERMANENT:
                            failure = _Failure(error, _now_ms(), time.monotonic())
                            break
                        now = _now_ms()
                        letters.append(self._letter(record, "permanent", error, 1, now, now))
                    done += 1
        except Exception as error:
            # The transaction as a whole failed (commit, lost connection): nothing took effect.
            # The first record is retried alone; the ones after it follow once it passes. A
            # record's own error (e.g. the lost connection) says more than the failed commit.
            cause = failure or _Failure(error, _now_ms(), time.monotonic())
            return _ChunkOutcome(0, [], cause)
        self._after_db_commit()
        self.stats.applied += applied
        self.stats.duplicates += duplicates
        self.stats.unhandled += unhandled
        return _ChunkOutcome(done, letters, failure)

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
            if not await self._pause(delay, epoch):
                log.info("abandoned retry of %s (stopping or partitions revoked)", where)
                return None
            self.stats.retries += 1
            try:
                step = self._prepare(record)
                if step is _SKIP:
                    self.stats.unhandled += 1
                    return _SKIP
                assert isinstance(step, _Run)
                async with self._sessions() as session, session.begin():
                    fresh = await self._apply(session, step)
            except Exception as next_error:
                attempts, error, last_ms = attempts + 1, next_error, _now_ms()
                if classify(error) is Category.PERMANENT:
                    return self._letter(record, "permanent", error, attempts, first_ms, last_ms)
                continue
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

    async def _commit(self, consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> None:
        try:
            await asyncio.wait_for(consumer.commit({tp: offset}), COMMIT_TIMEOUT_S)
        except (CommitFailedError, IllegalStateError) as error:
            # The partition moved to another member; it resumes from the last committed offset
            # and the inbox skips what this process already applied.
            log.info("offset commit for %s refused: %s", _describe([tp]), type(error).__name__)
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
        # hand: whatever it committed has its offset committed before the lock is released.
        self._epoch += 1
        self._wakeup.set()
        async with self._lock:
            self.assignment = set()
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
