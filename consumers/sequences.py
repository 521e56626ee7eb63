"""Dead letters that keep the order: a key whose record was dead-lettered waits behind it.

With ``on_dead_letter="sequence"`` (on a handler, or the app), a record of key K that is
dead-lettered *blocks* K for the consumer (a ``consumer_sequences`` row, committed before the
letter is delivered, so before the record's offset). Every later record of K is *held*
(a ``consumer_held_events`` row, in the transaction of its chunk, so before its offset) instead
of being applied; the partition goes on with the other keys, and offsets are committed as
usual: nothing depends on Kafka keeping a partition paused.

The block is resolved by the head itself arriving again (``outboxkit dlq replay``: the same
``(source, id)``) and being applied, or by an operator skipping or releasing it
(``outboxkit dlq sequences skip|release``). Then the held records are applied in their order,
each as a live record is (inbox claim, retries, handler timeout) and deleted in the
transaction of its effect; one that fails for good becomes the new head. The partition's owner
does it (a lease on the row keeps a second process out), so held records never overtake each
other nor the live ones behind them. A record of a blocked key arriving while the held ones are
being applied is held too, behind them.

Bounds: ``max_held_per_key`` and ``max_held`` (all keys of the consumer). Past them,
``on_hold_full="stop"`` makes the partition wait (order kept, the lag grows and is visible);
``"dead-letter"`` dead-letters the record instead, in order, while the key stays blocked.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from base64 import b64decode, b64encode
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import ConsumerRecord
from outboxkit.consumers.apply import (
    Applier,
    _Failure,
    _failure,
    _Full,
    _Head,
    _Hold,
    _Run,
    _Step,
)
from outboxkit.consumers.dlq import DeadLetter, DeadLetterDelivery
from outboxkit.consumers.tables import (
    KEY_SHOWN_MAX,
    consumer_held_events,
    consumer_sequences,
)
from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.errors import PermanentError
from sqlalchemy import Row, and_, delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

log = logging.getLogger("outboxkit.consumer")

DRAIN_LEASE_MS = 30_000
Pause = Callable[[float], Awaitable[bool]]
KeyRef = tuple[str, str]  # (topic, key hash)


class HeldQueueFullError(PermanentError):
    """A record of a blocked key found its held records at their bound, and
    ``on_hold_full="dead-letter"`` dead-letters it instead."""


def key_hash(key: bytes) -> str:
    """The stored form of a Kafka key: its SHA-256, hex (keys may be long or binary)."""
    return hashlib.sha256(key).hexdigest()


def key_shown(key: bytes) -> str:
    """The key as an operator reads it: UTF-8 (escaped where it is not), cut to fit."""
    return key.decode("utf-8", "backslashreplace")[:KEY_SHOWN_MAX]


@dataclass(slots=True)
class _Block:
    state: str
    head_source: str | None
    head_event_id: str | None
    head_offset: int | None
    held: int


def _ce_type(record: ConsumerRecord) -> str | None:
    for name, value in record.headers or ():
        if name == "ce_type" and value is not None:
            return bytes(value).decode("utf-8", "replace")
    return None


def _identity(step: _Step) -> tuple[str | None, str | None, str | None]:
    if isinstance(step, _Run):
        return step.source, step.event_id, step.event.get_type()
    return None, None, None


class SequenceKeeper:
    """The blocked keys of one consumer runtime: marks held records, blocks keys, drains them."""

    def __init__(
        self,
        applier: Applier,
        sessions: async_sessionmaker[AsyncSession],
        dlq: DeadLetterDelivery,
    ) -> None:
        self.applier = applier
        self._app = applier.app
        self._sessions = sessions
        self._dlq = dlq
        self._owner = uuid.uuid4().hex
        # Partitions that may have blocked keys: loaded after each assignment, grown as keys
        # are blocked here, so a batch of a partition without any costs no query at all.
        self._blocked_partitions: set[tuple[str, int]] | None = None
        applier.hold_writer = self._write_holds
        self.summary = (0, 0)
        """(blocked keys, held records) of the consumer, as last read."""

    @property
    def consumer(self) -> str:
        """The inbox name of the consumer."""
        return self._app.name

    def assigned(self) -> None:
        """Partitions moved: reload which ones have blocked keys before the next batch."""
        self._blocked_partitions = None

    def sequenced(self, record: ConsumerRecord) -> bool:
        """Whether ``record``'s handler keeps the order of its key across dead letters."""
        if record.key is None:
            return False
        event_type = _ce_type(record)
        handler = self._app.handler_for(record.topic, event_type) if event_type else None
        if handler is not None:
            return handler.sequenced
        return self._app.on_dead_letter == "sequence"

    # -- before a batch -------------------------------------------------------------------

    async def mark(self, records: Sequence[ConsumerRecord], steps: list[_Step]) -> BatchView:
        """Mark the records of blocked keys in ``steps`` (held, head, or full), and block the
        keys of sequenced records that cannot even be decoded."""
        view = BatchView(self, records, steps)
        if not records:
            return view
        topic, partition = records[0].topic, records[0].partition
        if self._blocked_partitions is None:
            self._blocked_partitions = await self._load_blocked_partitions()
        if (topic, partition) in self._blocked_partitions:
            hashes = {key_hash(r.key) for r in records if self.sequenced(r)}
            if hashes:
                view.blocks.update(await self._load_blocks(topic, hashes))
                if view.blocks:
                    view.total_held = await self._total_held()
        if view.blocks or any(isinstance(step, _Failure) and step.permanent for step in steps):
            await view.walk(0)
        return view

    async def _load_blocked_partitions(self) -> set[tuple[str, int]]:
        table = consumer_sequences.c
        async with self._sessions() as session:
            rows = await session.execute(
                select(table.topic, table.kafka_partition)
                .where(table.consumer == self.consumer)
                .distinct()
            )
            return {(row.topic, row.kafka_partition) for row in rows}

    async def _load_blocks(self, topic: str, hashes: set[str]) -> dict[KeyRef, _Block]:
        table = consumer_sequences.c
        async with self._sessions() as session:
            rows = await session.execute(
                select(
                    table.key_hash,
                    table.state,
                    table.head_source,
                    table.head_event_id,
                    table.head_offset,
                    table.held,
                ).where(
                    table.consumer == self.consumer,
                    table.topic == topic,
                    table.key_hash.in_(sorted(hashes)),
                )
            )
            return {
                (topic, row.key_hash): _Block(
                    row.state, row.head_source, row.head_event_id, row.head_offset, row.held
                )
                for row in rows
            }

    async def _total_held(self) -> int:
        table = consumer_sequences.c
        async with self._sessions() as session:
            total = await session.scalar(
                select(func.coalesce(func.sum(table.held), 0)).where(
                    table.consumer == self.consumer
                )
            )
            return int(total or 0)

    async def block(self, entries: Sequence[tuple[ConsumerRecord, _Step, str | None]]) -> None:
        """Record the keys of ``entries`` (record, its step, its error class) as blocked, with
        the record as head; a key blocked already stays as it is."""
        if not entries:
            return
        async with self._sessions() as session, session.begin():
            dialect = dialect_of(session)
            for record, step, error in entries:
                source, event_id, _ = _identity(step)
                statement = (
                    dialect.insert(consumer_sequences)
                    .values(
                        consumer=self.consumer,
                        topic=record.topic,
                        key_hash=key_hash(record.key),
                        key_shown=key_shown(record.key),
                        kafka_partition=record.partition,
                        state="blocked",
                        head_source=source,
                        head_event_id=event_id,
                        head_offset=record.offset,
                        head_error=(error or "-")[:200],
                        held=0,
                        blocked_ms=dialect.now_ms(),
                    )
                    .on_conflict_do_nothing(index_elements=["consumer", "topic", "key_hash"])
                )
                await session.execute(statement)
        if self._blocked_partitions is not None:
            self._blocked_partitions.update((r.topic, r.partition) for r, _, _ in entries)
        for record, _, error in entries:
            log.warning(
                "key %s of %s blocked for consumer %s behind the dead letter of %s[%d]@%d (%s)",
                key_shown(record.key)[:64],
                record.topic,
                self.consumer,
                record.topic,
                record.partition,
                record.offset,
                error or "-",
            )

    # -- held records ---------------------------------------------------------------------

    async def _write_holds(self, session: AsyncSession, holds: Sequence[_Hold]) -> None:
        dialect = dialect_of(session)
        counts: dict[KeyRef, int] = {}
        for hold in holds:
            record = hold.record
            inserted = await session.execute(
                dialect.insert(consumer_held_events)
                .values(
                    consumer=self.consumer,
                    topic=record.topic,
                    key_hash=hold.key_hash,
                    kafka_offset=record.offset,
                    kafka_partition=record.partition,
                    source=hold.source,
                    event_id=hold.event_id,
                    event_type=hold.event_type,
                    record_key=record.key,
                    record_value=record.value,
                    record_headers=_encode_headers(record.headers),
                    record_timestamp=record.timestamp,
                    held_ms=dialect.now_ms(),
                )
                .on_conflict_do_nothing(
                    index_elements=["consumer", "topic", "key_hash", "kafka_offset"]
                )
                .returning(consumer_held_events.c.kafka_offset)
            )
            if inserted.first() is not None:  # a redelivered record was held already
                ref = (record.topic, hold.key_hash)
                counts[ref] = counts.get(ref, 0) + 1
        table = consumer_sequences.c
        for (topic, hashed), count in counts.items():
            counted = await session.execute(
                update(consumer_sequences)
                .where(
                    table.consumer == self.consumer,
                    table.topic == topic,
                    table.key_hash == hashed,
                )
                .values(held=table.held + count)
            )
            if not getattr(counted, "rowcount", 0):
                # The key was unblocked meanwhile by another process's drain (a partition
                # moving under it): keep a released row, so these are drained too.
                record = next(
                    h.record for h in holds if (h.record.topic, h.key_hash) == (topic, hashed)
                )
                await session.execute(
                    dialect.insert(consumer_sequences)
                    .values(
                        consumer=self.consumer,
                        topic=topic,
                        key_hash=hashed,
                        key_shown=key_shown(record.key),
                        kafka_partition=record.partition,
                        state="released",
                        held=count,
                        blocked_ms=dialect.now_ms(),
                        resolution="orphaned",
                    )
                    .on_conflict_do_nothing(index_elements=["consumer", "topic", "key_hash"])
                )

    async def hold_alone(self, hold: _Hold) -> None:
        """Store one held record in a transaction of its own."""
        async with self._sessions() as session, session.begin():
            await self._write_holds(session, [hold])

    def release_head(self, head: _Head) -> Callable[[AsyncSession], Awaitable[None]]:
        """What commits with the head's effect: its key released, the held records to apply."""

        async def release(session: AsyncSession) -> None:
            table = consumer_sequences.c
            await session.execute(
                update(consumer_sequences)
                .where(
                    table.consumer == self.consumer,
                    table.topic == head.record.topic,
                    table.key_hash == head.key_hash,
                    table.state == "blocked",
                )
                .values(state="released", resolution="replayed")
            )

        return release

    async def drain(self, topic: str, hashed: str, pause: Pause) -> bool | None:
        """Apply the held records of a released key, in order.

        ``True``: all applied and the key unblocked; ``False``: one failed for good and is
        the new head (the key is blocked again); ``None``: abandoned (stop, revocation, or
        another process holds the drain lease): the rest waits, in the database.
        """
        while True:
            if not await self._lease(topic, hashed):
                return None
            row = await self._next_held(topic, hashed)
            if row is None:
                if await self._unblock(topic, hashed):
                    log.info("key of %s released for consumer %s", topic, self.consumer)
                    return True
                continue
            record = _record_of(row)
            letters = await self.applier.apply_alone(
                record, pause, also=self._forget_held(topic, hashed, record.offset)
            )
            if letters is None:
                return None
            if letters:
                # The letter first: the held row is the only copy of the record.
                if not await self._dlq.deliver(letters, pause):
                    return None
                await self._rehead(topic, hashed, row, letters[0].error_class)
                return False
            self.applier.stats.released += 1

    async def _lease(self, topic: str, hashed: str) -> bool:
        table = consumer_sequences.c
        async with self._sessions() as session, session.begin():
            now = dialect_of(session).now_ms()
            result = await session.execute(
                update(consumer_sequences)
                .where(
                    table.consumer == self.consumer,
                    table.topic == topic,
                    table.key_hash == hashed,
                    table.state == "released",
                    or_(
                        table.drainer.is_(None),
                        table.drainer == self._owner,
                        table.drain_until_ms < now,
                    ),
                )
                .values(drainer=self._owner, drain_until_ms=now + DRAIN_LEASE_MS)
            )
            return bool(getattr(result, "rowcount", 0))

    async def _next_held(self, topic: str, hashed: str) -> Row[Any] | None:
        table = consumer_held_events.c
        async with self._sessions() as session:
            result = await session.execute(
                select(consumer_held_events)
                .where(
                    table.consumer == self.consumer,
                    table.topic == topic,
                    table.key_hash == hashed,
                )
                .order_by(table.kafka_offset)
                .limit(1)
            )
            return result.first()

    def _forget_held(
        self, topic: str, hashed: str, offset: int
    ) -> Callable[[AsyncSession], Awaitable[None]]:
        async def forget(session: AsyncSession) -> None:
            await self._delete_held(session, topic, hashed, offset)

        return forget

    async def _delete_held(
        self, session: AsyncSession, topic: str, hashed: str, offset: int
    ) -> None:
        held = consumer_held_events.c
        deleted = await session.execute(
            delete(consumer_held_events).where(
                held.consumer == self.consumer,
                held.topic == topic,
                held.key_hash == hashed,
                held.kafka_offset == offset,
            )
        )
        if getattr(deleted, "rowcount", 0):
            table = consumer_sequences.c
            await session.execute(
                update(consumer_sequences)
                .where(
                    table.consumer == self.consumer,
                    table.topic == topic,
                    table.key_hash == hashed,
                )
                .values(held=table.held - 1)
            )

    async def _rehead(self, topic: str, hashed: str, row: Row[Any], error: str | None) -> None:
        table = consumer_sequences.c
        async with self._sessions() as session, session.begin():
            await self._delete_held(session, topic, hashed, row.kafka_offset)
            await session.execute(
                update(consumer_sequences)
                .where(
                    table.consumer == self.consumer,
                    table.topic == topic,
                    table.key_hash == hashed,
                )
                .values(
                    state="blocked",
                    head_source=row.source,
                    head_event_id=row.event_id,
                    head_offset=row.kafka_offset,
                    head_error=(error or "-")[:200],
                    blocked_ms=dialect_of(session).now_ms(),
                    resolution=None,
                    resolved_by=None,
                    reason=None,
                    drainer=None,
                    drain_until_ms=None,
                )
            )
        log.warning(
            "key of %s blocked again for consumer %s: its held record @%d failed (%s)",
            topic,
            self.consumer,
            row.kafka_offset,
            error or "-",
        )

    async def _unblock(self, topic: str, hashed: str) -> bool:
        """Delete the key's row once no record is held behind it; ``False`` if one is."""
        table = consumer_sequences.c
        held = consumer_held_events.c
        async with self._sessions() as session, session.begin():
            # Lock the row first: a hold committing meanwhile is then seen by the check below.
            await session.execute(
                select(table.state)
                .where(
                    table.consumer == self.consumer,
                    table.topic == topic,
                    table.key_hash == hashed,
                )
                .with_for_update()
            )
            result = await session.execute(
                delete(consumer_sequences).where(
                    table.consumer == self.consumer,
                    table.topic == topic,
                    table.key_hash == hashed,
                    table.state == "released",
                    ~select(held.kafka_offset)
                    .where(
                        and_(
                            held.consumer == self.consumer,
                            held.topic == topic,
                            held.key_hash == hashed,
                        )
                    )
                    .exists(),
                )
            )
            return bool(getattr(result, "rowcount", 0))

    async def released(self) -> list[tuple[str, int, str]]:
        """The released keys of this consumer: (topic, partition, key hash), oldest first."""
        table = consumer_sequences.c
        async with self._sessions() as session:
            rows = await session.execute(
                select(table.topic, table.kafka_partition, table.key_hash)
                .where(table.consumer == self.consumer, table.state == "released")
                .order_by(table.blocked_ms)
            )
            return [(row.topic, row.kafka_partition, row.key_hash) for row in rows]

    async def refresh_summary(self) -> None:
        """Read how many keys of the consumer are blocked and how many records they hold."""
        table = consumer_sequences.c
        async with self._sessions() as session:
            row = (
                await session.execute(
                    select(func.count(), func.coalesce(func.sum(table.held), 0)).where(
                        table.consumer == self.consumer
                    )
                )
            ).one()
        self.summary = (int(row[0]), int(row[1]))

    async def room(self, topic: str, hashed: str) -> bool:
        """Whether one more record of the key may be held now."""
        blocks = await self._load_blocks(topic, {hashed})
        block = blocks.get((topic, hashed))
        held = block.held if block else 0
        return held < self._app.max_held_per_key and await self._total_held() < self._app.max_held


class BatchView:
    """What one partition's batch knows about blocked keys while it is applied."""

    def __init__(
        self, keeper: SequenceKeeper, records: Sequence[ConsumerRecord], steps: list[_Step]
    ) -> None:
        self.keeper = keeper
        self.records = records
        self.steps = steps
        self.blocks: dict[KeyRef, _Block] = {}
        self.total_held = 0

    async def walk(self, start: int) -> None:
        """Mark the steps from ``start`` on by the blocks known; block the keys of sequenced
        records that failed to decode for good (before any of their later records)."""
        new: list[tuple[ConsumerRecord, _Step, str | None]] = []
        app = self.keeper._app
        for index in range(start, len(self.records)):
            record, step = self.records[index], self.steps[index]
            if isinstance(step, _Hold | _Head | _Full) or not self.keeper.sequenced(record):
                continue
            hashed = key_hash(record.key)
            ref = (record.topic, hashed)
            block = self.blocks.get(ref)
            if block is None:
                if isinstance(step, _Failure) and step.permanent:
                    new.append((record, step, type(step.error).__name__))
                    self.blocks[ref] = _Block("blocked", None, None, record.offset, 0)
                continue
            source, event_id, _ = _identity(step)
            if block.state == "blocked" and (
                (
                    block.head_event_id is not None
                    and (source, event_id) == (block.head_source, block.head_event_id)
                )
                or (block.head_event_id is None and block.head_offset == record.offset)
            ):
                self.steps[index] = _Head(record, hashed)
            elif block.held >= app.max_held_per_key or self.total_held >= app.max_held:
                if app.on_hold_full == "dead-letter":
                    self.steps[index] = _failure(
                        HeldQueueFullError("the held records of this key are at their bound")
                    )
                else:
                    self.steps[index] = _Full(record, hashed)
            else:
                self.steps[index] = self.held(step, record, hashed)
                block.held += 1
                self.total_held += 1
        await self.keeper.block(new)

    async def blocked_by(self, letters: Sequence[DeadLetter], after: int) -> None:
        """Block the keys of sequenced records among ``letters`` (just dead-lettered) that are
        not blocked yet, then mark their records from ``after`` on as held."""
        by_offset = {record.offset: i for i, record in enumerate(self.records)}
        new: list[tuple[ConsumerRecord, _Step, str | None]] = []
        for letter in letters:
            index = by_offset.get(letter.offset) if letter.offset is not None else None
            if index is None:
                continue
            record = self.records[index]
            if not self.keeper.sequenced(record):
                continue
            ref = (record.topic, key_hash(record.key))
            if ref in self.blocks:
                continue  # a head failing again, or a full hold dead-lettered
            step = self.steps[index]
            if not isinstance(step, _Run):  # the failed run was replaced by its failure
                step = self.keeper.applier.steps([record])[0]
            new.append((record, step, letter.error_class))
            source, event_id, _ = _identity(step)
            self.blocks[ref] = _Block("blocked", source, event_id, record.offset, 0)
        if new:
            await self.keeper.block(new)
            await self.walk(after)

    def held(self, step: _Step, record: ConsumerRecord, hashed: str) -> _Hold:
        """``record`` (prepared as ``step``) as a held record of its key."""
        source, event_id, event_type = _identity(step)
        return _Hold(record, hashed, source, event_id, event_type or _ce_type(record))

    def released(self, topic: str, hashed: str, after: int) -> None:
        """The key's held records were all applied and it is unblocked: its later records in
        this batch (from ``after`` on) are applied after all."""
        ref = (topic, hashed)
        self.blocks.pop(ref, None)
        applier = self.keeper.applier
        for index in range(after, len(self.records)):
            step = self.steps[index]
            if isinstance(step, _Hold | _Full) and (step.record.topic, step.key_hash) == ref:
                self.steps[index] = applier.steps([step.record])[0]


def _encode_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> bytes:
    """Record headers as stored: JSON pairs, values in base64 (``null`` kept)."""
    pairs = [
        [name, None if value is None else b64encode(bytes(value)).decode("ascii")]
        for name, value in headers or ()
    ]
    return json.dumps(pairs, separators=(",", ":")).encode("utf-8")


def _decode_headers(raw: bytes) -> tuple[tuple[str, bytes | None], ...]:
    return tuple(
        (name, None if value is None else b64decode(value))
        for name, value in json.loads(raw.decode("utf-8"))
    )


def _record_of(row: Row[Any]) -> ConsumerRecord:
    """The held record as aiokafka delivered it, for the applier."""
    return ConsumerRecord(
        topic=row.topic,
        partition=row.kafka_partition,
        offset=row.kafka_offset,
        timestamp=row.record_timestamp,
        timestamp_type=0,
        key=row.record_key,
        value=row.record_value,
        checksum=None,
        serialized_key_size=len(row.record_key or b""),
        serialized_value_size=len(row.record_value or b""),
        headers=_decode_headers(row.record_headers),
    )
