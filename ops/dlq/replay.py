"""Republishing dead-letter records to their original topic, once, with a ledger.

A replayed record is the original: the same key, value and headers, minus the ``outboxkit-*``
dead-letter headers, so a consumer's inbox recognises an event it had in fact applied. It goes
to the topic named by ``outboxkit-original-topic`` (or one chosen by the operator).

A dead letter cut down to fit (``outboxkit-truncated``: its value cut to 64 KiB, or dropped)
is not the original: republished as it is, under the same ``(source, id)``, the consumer would
apply the cut value and take the real event for a duplicate. Such a letter is refused (the run
stops there with :class:`TruncatedLetterError`) unless ``truncated`` says otherwise:
``"original"`` republishes the original record, fetched from its source topic at the
partition and offset the letter names while that topic still retains it (checked against the
letter: same size, the cut value a prefix of it, the same key); ``"allow"`` republishes the cut
letter under a new id, ``truncated-`` and 32 hex digits of a hash of the letter's position and
its original id (the same on every replay), keeping the truncation headers and naming the
original id in ``outboxkit-original-id``.

A discarded letter (:mod:`outboxkit.ops.dlq.discard`) is never republished, forced or not: it
is counted ``discarded`` until it is un-discarded.

Idempotence: a record is republished to a topic only if ``dlq_replays`` has no row for
``(dlq topic, partition, offset, target topic)``, unless forced. The row is written only after
Kafka acknowledged the record, so a crash between the two republishes at most one chunk again,
which the consumers' inboxes absorb. Two replays run at the same moment may both publish a
record: the ledger is a record of what was done, not a lock.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka import AIOKafkaProducer
from outboxkit.consumers.dlq_headers import ORIGINAL_SIZE, TRUNCATED, Header
from outboxkit.ops.access import OpsError, kafka_bounded
from outboxkit.ops.dlq.discard import discarded_keys
from outboxkit.ops.dlq.reader import (
    DlqFilter,
    DlqReader,
    DlqRecord,
    OffsetOutOfRangeError,
    UnknownTopicError,
)
from outboxkit.ops.dlq.tables import REPLAYED_BY_MAX, dlq_replays
from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.jsonable import as_json
from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine
from uuid_utils import uuid7

CHUNK = 200
MAX_LISTED = 1000

ORIGINAL_ID = "outboxkit-original-id"
"""On a truncated letter replayed under a new id: the id of the event it was cut from."""
Truncated = Literal["refuse", "original", "allow"]

Status = Literal[
    "replayed", "would replay", "already replayed", "discarded", "no target", "target missing"
]


@dataclass(frozen=True)
class ReplayOptions:
    """How to replay: where to, who asks, and how fast.

    ``target``: a topic for every record instead of each one's original topic. ``rate``:
    records per second at most (``None``: as fast as the broker acknowledges). ``force``:
    republish records the ledger says were replayed already. ``truncated``: what to do with a
    letter cut down to fit (see the module docstring): ``"refuse"`` (the default),
    ``"original"`` or ``"allow"``.
    """

    by: str
    target: str | None = None
    dry_run: bool = False
    rate: float | None = None
    force: bool = False
    truncated: Truncated = "refuse"

    def __post_init__(self) -> None:
        if self.rate is not None and self.rate <= 0:
            raise OpsError("--rate must be a positive number of records per second")
        if not self.by.strip() or len(self.by) > REPLAYED_BY_MAX:
            raise OpsError(f"--by must have 1 to {REPLAYED_BY_MAX} characters")


class TruncatedLetterError(OpsError):
    """A truncated dead letter met without ``--fetch-original`` or ``--allow-truncated``, or one
    whose original record can no longer be fetched."""


@dataclass(frozen=True, slots=True)
class Outgoing:
    """What is republished for one dead letter: its key, value and headers."""

    key: bytes | None
    value: bytes | None
    headers: list[Header]


@dataclass(frozen=True, slots=True)
class ReplayItem:
    """What happened to one matching dead-letter record."""

    partition: int
    offset: int
    type: str | None
    id: str | None
    target: str | None
    status: Status


@dataclass
class ReplaySummary:
    """The outcome of one replay run (or dry run)."""

    replay_id: str
    dlq_topic: str
    by: str
    dry_run: bool
    matched: int = 0
    replayed: int = 0
    already_replayed: int = 0
    discarded: int = 0
    no_target: int = 0
    target_missing: Counter[str] = field(default_factory=Counter)
    by_target: Counter[str] = field(default_factory=Counter)
    items: list[ReplayItem] = field(default_factory=list)
    more_items: int = 0

    def add(self, item: ReplayItem) -> None:
        """Count ``item`` and keep it for the listing (up to :data:`MAX_LISTED`)."""
        if item.status in ("replayed", "would replay"):
            self.replayed += 1
            self.by_target[item.target or ""] += 1
        elif item.status == "already replayed":
            self.already_replayed += 1
        elif item.status == "discarded":
            self.discarded += 1
        elif item.status == "no target":
            self.no_target += 1
        else:
            self.target_missing[item.target or ""] += 1
        if len(self.items) < MAX_LISTED:
            self.items.append(item)
        else:
            self.more_items += 1

    def to_json(self) -> dict[str, Any]:
        """JSON-ready values; the skip counters keep the names scripts read."""
        return as_json(
            self,
            rename={
                "already_replayed": "skipped_already_replayed",
                "discarded": "skipped_discarded",
                "no_target": "skipped_no_target",
                "target_missing": "skipped_target_missing",
                "items": "records",
                "more_items": "more_records",
            },
        )


class _Pacer:
    """Spaces sends so that at most ``rate`` go per second."""

    def __init__(self, rate: float | None) -> None:
        self._interval = 1.0 / rate if rate else 0.0
        self._next = time.monotonic()

    async def wait(self) -> None:
        if not self._interval:
            return
        now = time.monotonic()
        if self._next > now:
            await asyncio.sleep(self._next - now)
        self._next = max(self._next, now) + self._interval


class Replayer:
    """Replays matching records of a dead-letter topic; see the module docstring."""

    def __init__(
        self,
        reader: DlqReader,
        engine: AsyncEngine,
        *,
        producer_options: dict[str, Any] | None = None,
    ) -> None:
        self.reader = reader
        self.engine = engine
        self._producer_options = dict(producer_options or {})
        self._producer: AIOKafkaProducer | None = None
        self._sources: DlqReader | None = None  # reads originals; the main reader is mid-read

    async def run(
        self,
        dlq_topic: str,
        wanted: DlqFilter,
        options: ReplayOptions,
        progress: Callable[[int, int, int], None] | None = None,
    ) -> ReplaySummary:
        """Replay (or with ``dry_run`` only list) the records of ``dlq_topic`` that match.

        ``progress(offsets covered, offsets to cover, records replayed)`` is called as it goes.
        """
        summary = ReplaySummary(str(uuid7()), dlq_topic, options.by, options.dry_run)
        ranges = await self.reader.plan(dlq_topic, wanted)
        total = sum(span.size for span in ranges)
        topics = await self.reader.topics()
        if options.target is not None and options.target not in topics:
            raise UnknownTopicError(f"target topic {options.target!r} does not exist")
        pacer = _Pacer(options.rate)
        # Rate-limited chunks last about a quarter of a second, so progress and the ledger
        # follow closely what has been sent.
        chunk_size = CHUNK if options.rate is None else max(1, min(CHUNK, int(options.rate / 4)))
        if not options.dry_run:
            await self._start_producer()
        try:
            chunk: list[DlqRecord] = []
            async for record in self.reader.read(dlq_topic, wanted, ranges):
                summary.matched += 1
                chunk.append(record)
                if len(chunk) >= chunk_size:
                    await self._chunk(dlq_topic, chunk, options, topics, pacer, summary)
                    chunk = []
                if progress is not None:
                    progress(self.reader.progress, total, summary.replayed)
            if chunk:
                await self._chunk(dlq_topic, chunk, options, topics, pacer, summary)
            if progress is not None:
                progress(total, total, summary.replayed)
        finally:
            await self._stop_producer()
            if self._sources is not None:
                await self._sources.close()
                self._sources = None
        return summary

    async def _start_producer(self) -> None:
        options = self.reader.kafka.client_options("outboxkit-dlq-replay")
        options.update(self._producer_options)
        # Idempotent and acks=all: the ledger row is written only once the broker has it.
        options.update(
            enable_idempotence=True,
            acks="all",
            request_timeout_ms=max(1000, int(self.reader.timeout * 1000)),
        )
        self._producer = AIOKafkaProducer(**options)
        try:
            async with kafka_bounded(self.reader.kafka, self.reader.timeout, "connecting"):
                await self._producer.start()
        except BaseException:
            await self._stop_producer()
            raise

    async def _stop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def _chunk(
        self,
        dlq_topic: str,
        records: Sequence[DlqRecord],
        options: ReplayOptions,
        topics: dict[str, list[int]],
        pacer: _Pacer,
        summary: ReplaySummary,
    ) -> None:
        planned: list[tuple[DlqRecord, str]] = []
        discarded = await discarded_keys(
            self.engine, dlq_topic, [(r.partition, r.offset) for r in records]
        )
        for record in records:
            target = options.target or record.letter.topic
            if (record.partition, record.offset) in discarded:
                summary.add(_item(record, target, "discarded"))
            elif target is None:
                summary.add(_item(record, None, "no target"))
            elif target not in topics:
                summary.add(_item(record, target, "target missing"))
            else:
                planned.append((record, target))
        done = set() if options.force else await self._replayed(dlq_topic, planned)
        to_send = []
        for record, target in planned:
            if (record.partition, record.offset, target) in done:
                summary.add(_item(record, target, "already replayed"))
            elif options.dry_run:
                if record.letter.truncated and options.truncated == "refuse":
                    raise _refusal(dlq_topic, record)
                summary.add(_item(record, target, "would replay"))
            else:
                to_send.append((record, target))
        if not to_send:
            return
        outgoing = [await self._outgoing(dlq_topic, record, options) for record, _ in to_send]
        await self._publish(dlq_topic, to_send, outgoing, pacer, summary, options)

    async def _replayed(
        self, dlq_topic: str, planned: Sequence[tuple[DlqRecord, str]]
    ) -> set[tuple[int, int, str]]:
        if not planned:
            return set()
        columns = dlq_replays.c
        keys = [(r.partition, r.offset, target) for r, target in planned]
        query = select(columns.dlq_partition, columns.dlq_offset, columns.target_topic).where(
            columns.dlq_topic == dlq_topic,
            tuple_(columns.dlq_partition, columns.dlq_offset, columns.target_topic).in_(keys),
        )
        async with self.engine.connect() as connection:
            rows = (await connection.execute(query)).all()
        return {(row.dlq_partition, row.dlq_offset, row.target_topic) for row in rows}

    async def _outgoing(
        self, dlq_topic: str, record: DlqRecord, options: ReplayOptions
    ) -> Outgoing:
        """What to republish for ``record``; raises :class:`TruncatedLetterError` when it is
        truncated and may not go (see the module docstring)."""
        letter = record.letter
        if not letter.truncated:
            return Outgoing(letter.key, letter.value, letter.original_headers())
        if options.truncated == "refuse":
            raise _refusal(dlq_topic, record)
        if options.truncated == "allow":
            return _marked(dlq_topic, record)
        return await self._original(dlq_topic, record)

    async def _original(self, dlq_topic: str, record: DlqRecord) -> Outgoing:
        letter = record.letter
        where = f"{dlq_topic}[{record.partition}]@{record.offset}"
        left_out = letter.truncated or ""
        if letter.topic is None or letter.partition is None or letter.offset is None:
            raise TruncatedLetterError(
                f"{where} is a truncated dead letter that does not name its original record; "
                "only --allow-truncated can replay it"
            )
        source = f"{letter.topic}[{letter.partition}]@{letter.offset}"
        if self._sources is None:
            self._sources = DlqReader(self.reader.kafka, self.reader.timeout)
            await self._sources.__aenter__()
        try:
            found = (
                await self._sources.fetch(letter.topic, letter.partition, letter.offset)
            ).letter
        except (OffsetOutOfRangeError, UnknownTopicError) as error:
            raise TruncatedLetterError(
                f"the original of truncated dead letter {where} is no longer retained ({error}); "
                "only --allow-truncated can replay it"
            ) from None
        cut = letter.value or b""
        size = len(found.value or b"")
        same_key = "key" in left_out or found.key == letter.key
        if (
            (letter.original_size not in (None, size))
            or not (found.value or b"").startswith(cut)
            or not same_key
        ):
            raise TruncatedLetterError(
                f"the record at {source} is not the original of truncated dead letter {where} "
                f"(its size, value or key differ); only --allow-truncated can replay it"
            )
        return Outgoing(found.key, found.value, found.original_headers())

    async def _publish(
        self,
        dlq_topic: str,
        to_send: Sequence[tuple[DlqRecord, str]],
        outgoing: Sequence[Outgoing],
        pacer: _Pacer,
        summary: ReplaySummary,
        options: ReplayOptions,
    ) -> None:
        assert self._producer is not None
        kafka, timeout = self.reader.kafka, self.reader.timeout
        futures: list[asyncio.Future[Any]] = []
        send_error: OpsError | None = None
        try:
            for (_, target), out in zip(to_send, outgoing, strict=True):
                await pacer.wait()
                async with kafka_bounded(kafka, timeout, f"sending to {target}"):
                    futures.append(
                        await self._producer.send(
                            target, value=out.value, key=out.key, headers=out.headers
                        )
                    )
        except OpsError as error:
            send_error = error
        if futures:
            await asyncio.wait(futures, timeout=timeout)
        # Only what the broker acknowledged is recorded; anything else stays replayable.
        acked = [sent for sent, future in zip(to_send, futures, strict=False) if _acked(future)]
        await self._record(dlq_topic, acked, options, summary.replay_id)
        for record, target in acked:
            summary.add(_item(record, target, "replayed"))
        unacked = len(to_send) - len(acked)
        if send_error is None and not unacked:
            return
        reason = send_error or next(
            (_reason(future) for future in futures if not _acked(future)), "no acknowledgement"
        )
        raise OpsError(
            f"{unacked} record(s) not replayed ({reason}); {summary.replayed} replayed and "
            "recorded in dlq_replays; run the same replay again to continue"
        )

    async def _record(
        self,
        dlq_topic: str,
        acked: Sequence[tuple[DlqRecord, str]],
        options: ReplayOptions,
        replay_id: str,
    ) -> None:
        if not acked:
            return
        dialect = dialect_of(self.engine)
        rows = [
            {
                "dlq_topic": dlq_topic,
                "dlq_partition": record.partition,
                "dlq_offset": record.offset,
                "target_topic": target,
                "replayed_ms": dialect.now_ms(),
                "replayed_by": options.by,
                "replay_id": replay_id,
            }
            for record, target in acked
        ]
        statement = dialect.insert(dlq_replays).values(rows)
        # A forced replay keeps one row per record and target: the latest replay of it.
        statement = statement.on_conflict_do_update(
            index_elements=["dlq_topic", "dlq_partition", "dlq_offset", "target_topic"],
            set_={
                "replayed_ms": statement.excluded.replayed_ms,
                "replayed_by": statement.excluded.replayed_by,
                "replay_id": statement.excluded.replay_id,
            },
        )
        async with self.engine.begin() as connection:
            await connection.execute(statement)


def _refusal(dlq_topic: str, record: DlqRecord) -> TruncatedLetterError:
    letter = record.letter
    size = "" if letter.original_size is None else f" of {letter.original_size} bytes"
    source = (
        f"{letter.topic}[{letter.partition}]@{letter.offset}"
        if letter.topic is not None
        else "its source topic"
    )
    return TruncatedLetterError(
        f"{dlq_topic}[{record.partition}]@{record.offset} is a truncated dead letter (its "
        f"{letter.truncated} cut from an event{size}): replayed as it is, the cut event would be "
        f"taken for the real one; give --fetch-original to republish the original from "
        f"{source} while it is retained, or --allow-truncated to publish the cut one under a "
        "new id"
    )


def _marked(dlq_topic: str, record: DlqRecord) -> Outgoing:
    """The cut letter under a new id (binary-mode ``ce_id``), its truncation headers kept."""
    letter = record.letter
    original_id = record.id or ""
    digest = hashlib.sha256(
        f"{dlq_topic}\x00{record.partition}\x00{record.offset}\x00{original_id}".encode()
    ).hexdigest()[:32]
    headers = [(n, v) for n, v in letter.original_headers() if n.lower() != "ce_id"]
    facts = {TRUNCATED: letter.truncated, ORIGINAL_SIZE: letter.original_size}
    headers += [(n, str(v).encode()) for n, v in facts.items() if v is not None]
    headers += [("ce_id", f"truncated-{digest}".encode()), (ORIGINAL_ID, original_id.encode())]
    return Outgoing(letter.key, letter.value, headers)


def _acked(future: asyncio.Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _reason(future: asyncio.Future[Any]) -> str:
    if not future.done():
        return "no acknowledgement in time"
    if future.cancelled():
        return "cancelled"
    error = future.exception()
    return f"{type(error).__name__}: {error}"


def _item(record: DlqRecord, target: str | None, status: Status) -> ReplayItem:
    return ReplayItem(record.partition, record.offset, record.type, record.id, target, status)
