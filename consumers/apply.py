"""Applying a partition's records once, through the inbox: optimistic chunks, careful mode, retry.

A partition's records of a fetched batch are decoded first, then applied *optimistically*: one
transaction claims all their inbox rows in one statement (``claim_many``), runs the handlers of
the new ones in offset order without savepoints, and commits once. If a handler raises, that
transaction is rolled back; the records before the failing one are applied again without it,
in a fresh transaction, and the failing one is dead-lettered (permanent failure) or retried
alone with backoff (any other), exactly as if it had failed on its own. The rest of that batch
then runs in *careful* mode: per record a SAVEPOINT holding its inbox claim and its handler, so a
record that fails permanently rolls back only its own work. The runtime commits the Kafka offset
of a chunk only after its database commit and after its dead letters are acknowledged.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aiokafka import ConsumerRecord
from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers.app import ConsumerApp, Handler
from outboxkit.consumers.decoding import decode_lazily
from outboxkit.consumers.dlq import DeadLetter, dead_letter_for
from outboxkit.consumers.errors import (
    Category,
    HandlerTimeoutError,
    NoHandlerError,
    classify,
    error_class,
)
from outboxkit.consumers.in_flight import InFlight
from outboxkit.consumers.inbox import claim, claim_many
from outboxkit.consumers.metrics import ConsumerStats
from outboxkit.consumers.tracing import HandlerTelemetry, Transaction
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

log = logging.getLogger("outboxkit.consumer")

# Careful mode commits after this many records: PostgreSQL keeps 64 subtransactions per backend
# in shared memory; beyond that every snapshot of every session consults pg_subtrans.
CAREFUL_CHUNK = 50


@dataclass(slots=True)  # not frozen: one is built per record, and frozen init costs more
class _Run:
    """A record ready to apply: its handler, event attributes and bound arguments."""

    handler: Handler
    source: str
    event_id: str
    arguments: dict[str, Any]
    record: ConsumerRecord
    event: CloudEvent


class _Skip(enum.Enum):
    """A record no handler takes, skipped (``ConsumerApp.unhandled == "skip"``)."""

    SKIP = enum.auto()


_SKIP: Final = _Skip.SKIP


@dataclass(slots=True)
class _Hold:
    """A record of a blocked key (``on_dead_letter="sequence"``): stored, not applied."""

    record: ConsumerRecord
    key_hash: str
    source: str | None
    event_id: str | None
    event_type: str | None


@dataclass(slots=True)
class _Head:
    """The dead-lettered head of a blocked key, arriving again (replayed or redelivered): it is
    applied alone, and its success releases the records held behind it."""

    record: ConsumerRecord
    key_hash: str


@dataclass(slots=True)
class _Full:
    """A record of a blocked key whose held records reached their bound
    (``on_hold_full="stop"``): its partition waits until there is room."""

    record: ConsumerRecord
    key_hash: str


HoldWriter = Callable[[AsyncSession, Sequence[_Hold]], Awaitable[None]]
"""Stores held records in the transaction of their chunk (:mod:`.sequences`)."""
Extra = Callable[[AsyncSession], Awaitable[None]]


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
_Step = _Run | _Skip | _Failure | _Hold | _Head | _Full


@dataclass(slots=True)
class _ChunkOutcome:
    """``done`` records applied, skipped or to dead-letter; ``failure`` of the next one."""

    done: int
    letters: list[DeadLetter]
    failure: _Failure | None
    fell_back: bool = False


class HandlerInterrupt(BaseException):
    """A handler raised ``KeyboardInterrupt`` or ``SystemExit``: the consumer stops.

    Not an :class:`Exception`, so no retry or dead-letter path takes it: the record's
    transaction is rolled back, its partition's work ends without committing its offset, and
    :meth:`~outboxkit.consumers.runtime.ConsumerRuntime.run` raises it (``outboxkit consume``
    exits 5). ``where`` is ``type topic[partition]@offset``, never a payload.
    """

    def __init__(self, raised: BaseException, where: str) -> None:
        super().__init__(f"a handler raised {type(raised).__name__} on {where}")
        self.raised = raised
        self.where = where


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


def _blocks(step: _Step) -> bool:
    """Whether a record's step stops a chunk: a failure that is to be retried, or a record
    of a blocked key that is handled on its own (a head arriving again, a full hold)."""
    return isinstance(step, _Head | _Full) or (isinstance(step, _Failure) and not step.permanent)


class Applier:
    """Applies records of ``app`` in database transactions of ``sessions``, once each.

    ``on_db_commit`` (if given) is called right after each database commit that claimed events
    (new or duplicate), before their offsets can be committed.
    """

    def __init__(
        self,
        app: ConsumerApp,
        sessions: async_sessionmaker[AsyncSession],
        telemetry: HandlerTelemetry,
        stats: ConsumerStats,
        on_db_commit: Callable[[], None] | None = None,
    ) -> None:
        self.app = app
        self._sessions = sessions
        self._telemetry = telemetry
        self._stats = stats
        self._on_db_commit = on_db_commit
        self.in_flight = InFlight()
        # Set by the runtime when the app has handlers with on_dead_letter="sequence".
        self.hold_writer: HoldWriter | None = None

    @property
    def stats(self) -> ConsumerStats:
        """The counters this applier adds to (shared with its runtime)."""
        return self._stats

    def steps(self, records: Sequence[ConsumerRecord]) -> list[_Step]:
        """Decode ``records`` and bind their handlers' arguments, before any database work."""
        return [self._step(record) for record in records]

    def _prepare(self, record: ConsumerRecord) -> _Run | _Skip:
        """Decode a record and bind its handler's arguments; ``_SKIP`` if no handler takes it.

        Raises a permanent error for an undecodable record, invalid data, or an unhandled type
        when those are dead-lettered.
        """
        event = decode_lazily(record.headers, record.value)
        handler = self.app.handler_for(record.topic, event.get_type())
        if handler is None:
            event.check_data()  # invalid JSON is refused whoever would have read it
            if self.app.unhandled == "skip":
                return _SKIP
            raise NoHandlerError(f"no handler for this event type on topic {record.topic!r}")
        arguments = handler.bind(event, record)  # a model validates JSON data from the bytes
        event.check_data()  # ... and when none did, it is parsed now
        return _Run(handler, event.get_source(), event.get_id(), arguments, record, event)

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
            await self._invoke(session, [run])
        return True

    async def _invoke(self, session: AsyncSession, runs: Sequence[_Run]) -> None:
        """Call the handler of ``runs`` (several: one batch call) within its timeout.

        Raises :class:`HandlerTimeoutError` when the call is cancelled at its deadline.
        """
        handler = runs[0].handler
        timeout_s = self.app.timeout_for(handler)
        with self.in_flight.running(handler, [run.record for run in runs]):
            deadline = asyncio.timeout(timeout_s)
            try:
                async with deadline:
                    if len(runs) == 1:
                        await handler.call(session, runs[0].arguments)
                    else:
                        await handler.call_batch(session, [run.arguments for run in runs])
            except (KeyboardInterrupt, SystemExit) as raised:
                record = runs[0].record
                where = (
                    f"{runs[0].event.get_type()} {record.topic}[{record.partition}]@{record.offset}"
                )
                log.error(
                    "handler %s raised %s on %s; stopping the consumer, offset not committed",
                    handler.name,
                    type(raised).__name__,
                    where,
                )
                raise HandlerInterrupt(raised, where) from None
            except TimeoutError:
                if not deadline.expired():
                    raise  # the handler's own TimeoutError
                log.warning(
                    "handler %s timed out after %g s on %s[%d]@%d",
                    handler.name,
                    timeout_s,
                    runs[0].record.topic,
                    runs[0].record.partition,
                    runs[0].record.offset,
                )
                raise HandlerTimeoutError(
                    f"handler {handler.name} did not return within {timeout_s:g} s"
                ) from None

    async def run_optimistic(
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
        runs = [(i, step) for i in range(start, stop) if isinstance(step := steps[i], _Run)]
        holds = [step for i in range(start, stop) if isinstance(step := steps[i], _Hold)]
        unhandled = sum(1 for i in range(start, stop) if steps[i] is _SKIP)
        applied = 0
        if runs or holds:
            failed: _HandlerFailed | None = None
            calls = self._telemetry.transaction()
            try:
                async with self._sessions() as session, session.begin():
                    if holds:
                        await self._hold(session, holds)
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
                                    await self._invoke(session, [first])
                            else:
                                with calls.call_batch([(r.record, r.event) for _, r in group]):
                                    await self._invoke(session, [run for _, run in group])
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
        self._stats.applied += applied
        self._stats.duplicates += len(runs) - applied
        self._stats.unhandled += unhandled
        self._stats.held += len(holds)

    async def _hold(self, session: AsyncSession, holds: Sequence[_Hold]) -> None:
        assert self.hold_writer is not None, "held records without a sequence keeper"
        await self.hold_writer(session, holds)

    async def run_careful(
        self, records: Sequence[ConsumerRecord], steps: list[_Step], start: int
    ) -> _ChunkOutcome:
        """Apply records in one transaction, a savepoint each, until one needs a retry."""
        done, applied, duplicates, unhandled, held = 0, 0, 0, 0, 0
        letters: list[DeadLetter] = []
        failure: _Failure | None = None
        calls = self._telemetry.transaction()
        try:
            async with self._sessions() as session, session.begin():
                for index in range(start, min(len(records), start + CAREFUL_CHUNK)):
                    record, step = records[index], steps[index]
                    if isinstance(step, _Head | _Full):
                        break  # handled on its own by the runtime
                    if isinstance(step, _Hold):
                        await self._hold(session, [step])
                        held += 1
                    elif isinstance(step, _Failure):
                        if not step.permanent:
                            failure = step
                            break
                        letters.append(self._permanent_letter(record, step))
                    elif step is _SKIP:
                        unhandled += 1
                    else:
                        try:
                            async with session.begin_nested():
                                fresh = await self._apply(session, step, calls)
                        except Exception as error:
                            if classify(error) is not Category.PERMANENT:
                                failure = _failure(error)
                                break
                            letters.append(self._permanent_letter(record, _failure(error)))
                            if step.handler.sequenced:
                                # Its key is blocked before any later record of it is seen.
                                done += 1
                                break
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
        self._stats.applied += applied
        self._stats.duplicates += duplicates
        self._stats.unhandled += unhandled
        self._stats.held += held
        return _ChunkOutcome(done, letters, failure)

    def _permanent_letter(self, record: ConsumerRecord, failure: _Failure) -> DeadLetter:
        return self._letter(record, "permanent", failure.error, 1, failure.at_ms, failure.at_ms)

    async def retry_alone(
        self,
        record: ConsumerRecord,
        failure: _Failure,
        pause: Callable[[float], Awaitable[bool]],
    ) -> list[DeadLetter] | None:
        """Retry one record with backoff until it passes or is given up.

        Returns the dead letters to deliver (none once it was applied or skipped, its own
        when given up), or ``None`` when ``pause`` said to abandon it (stop or revocation).
        """
        return await self.apply_alone(record, pause, failure=failure)

    async def apply_alone(
        self,
        record: ConsumerRecord,
        pause: Callable[[float], Awaitable[bool]],
        *,
        failure: _Failure | None = None,
        also: Extra | None = None,
    ) -> list[DeadLetter] | None:
        """Apply one record in a transaction of its own, retrying with backoff until it passes
        or is given up; as :meth:`retry_alone`.

        ``failure``: its first attempt failed already (the next one waits for the backoff).
        ``also(session)``: more work in each attempt's transaction, committed with the effect
        (a blocked key's bookkeeping, :mod:`.sequences`).
        """
        if failure is None:
            failure = await self._attempt(record, 1, also)
            if failure is None:
                return []
            if failure.permanent:
                return [self._permanent_letter(record, failure)]
        attempts, error = 1, failure.error
        first_ms = last_ms = failure.at_ms
        # The time budget runs from here: a failure recorded while the records before this one
        # were still being retried (a database failing over) must not have spent it already.
        retrying_since = max(failure.at_monotonic, time.monotonic())
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        log.warning(
            "partition %s[%d] blocked at offset %d by %s; retrying",
            record.topic,
            record.partition,
            record.offset,
            error_class(classify(error).value, error),
        )
        while True:
            delay = self.app.retry.next_delay(attempts, time.monotonic() - retrying_since)
            if delay is None:
                log.warning("gave up on %s after %d attempts", where, attempts)
                return [self._letter(record, "exhausted", error, attempts, first_ms, last_ms)]
            self._telemetry.retrying(record, attempts, error)
            if not await pause(delay):
                log.info("abandoned retry of %s (stopping or partitions revoked)", where)
                return None
            self._stats.retries += 1
            next_failure = await self._attempt(record, attempts + 1, also)
            if next_failure is not None:
                attempts, error, last_ms = attempts + 1, next_failure.error, next_failure.at_ms
                if next_failure.permanent:
                    return [self._letter(record, "permanent", error, attempts, first_ms, last_ms)]
                continue
            log.info("partition %s[%d] unblocked", record.topic, record.partition)
            return []

    async def _attempt(
        self, record: ConsumerRecord, attempt: int, also: Extra | None
    ) -> _Failure | None:
        """One attempt at ``record`` (and ``also``) in a transaction; its failure, if any."""
        calls = self._telemetry.transaction()
        try:
            step = self._prepare(record)
            if step is _SKIP and also is None:
                self._stats.unhandled += 1
                return None
            async with self._sessions() as session, session.begin():
                fresh = False
                if isinstance(step, _Run):
                    fresh = await self._apply(session, step, calls, attempt)
                if also is not None:
                    await also(session)
        except Exception as error:
            calls.rolled_back()
            return _failure(error)
        calls.committed()
        if step is _SKIP:
            self._stats.unhandled += 1
            return None
        self._after_db_commit()
        self._stats.applied += fresh
        self._stats.duplicates += not fresh
        return None

    def _after_db_commit(self) -> None:
        self._stats.db_commits += 1
        if self._on_db_commit is not None:
            self._on_db_commit()

    def _letter(
        self,
        record: ConsumerRecord,
        category: str,
        error: BaseException,
        attempts: int,
        first_ms: int,
        last_ms: int,
    ) -> DeadLetter:
        self._telemetry.dead_lettered(record, attempts, error, error_class(category, error))
        return dead_letter_for(record, category, error, attempts, first_ms, last_ms)
