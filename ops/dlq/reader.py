"""Reading a dead-letter topic: typed records, filters, and bounded reads of offset ranges.

A read takes each partition's beginning and end offsets when it starts and stops at that end,
so a dead-letter topic that keeps growing still ends. Topics are looked up in the full cluster
metadata first: asking the broker about one topic by name would create it where topics are
auto-created.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from outboxkit.consumers.dlq_headers import DeadLetter, header_texts
from outboxkit.ops.access import DEFAULT_TIMEOUT_S, KafkaUnreachableError, OpsError, kafka_bounded
from outboxkit.ops.dlq.fingerprint import fingerprint, fingerprint_id
from outboxkit.outbox.jsonable import as_json
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.kafka_topics import topic_partitions

ERROR_CATEGORIES = ("permanent", "exhausted")
FETCH_WAIT_MS = 500
FETCH_MAX_RECORDS = 500


class UnknownTopicError(OpsError):
    """The topic does not exist on the cluster."""


class FilterError(OpsError):
    """A filter is contradictory or names something that does not exist."""


class OffsetOutOfRangeError(OpsError):
    """The offsets asked for are not (or no longer) in the partition."""


@dataclass(frozen=True, slots=True)
class DlqRecord:
    """A dead letter read back: where it sits in the dead-letter topic, and the letter itself.

    ``type``, ``source`` and ``id`` are the original CloudEvent's, when the record is one.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    """When it was dead-lettered (the dead-letter record's timestamp, epoch ms)."""
    letter: DeadLetter
    type: str | None
    source: str | None
    id: str | None

    @classmethod
    def from_record(cls, record: ConsumerRecord) -> DlqRecord:
        """Parse a consumed dead-letter record; missing or unreadable facts are ``None``."""
        letter = DeadLetter.from_record(record)
        event = _event_attributes(header_texts(letter.headers), record.value)
        return cls(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            timestamp=record.timestamp,
            letter=letter,
            type=event.get("type"),
            source=event.get("source"),
            id=event.get("id"),
        )

    @property
    def fingerprint(self) -> str:
        """The failure's cause: error class and message with its values stripped."""
        return fingerprint(self.letter.error_class, self.letter.error_message)

    @property
    def fingerprint_id(self) -> str:
        """A short stable id of :attr:`fingerprint`."""
        return fingerprint_id(self.letter.error_class, self.letter.error_message)

    def to_json(self) -> dict[str, Any]:
        """The record's facts as JSON-ready values; never the key or the payload."""
        return {
            **as_json(self, omit={"letter"}, rename={"timestamp": "timestamp_ms"}),
            **as_json(self.letter, omit={"key", "value", "headers"}, rename=_ORIGINAL),
            "fingerprint": self.fingerprint_id,
            "value_bytes": len(self.letter.value or b""),
        }


_ORIGINAL = {
    "topic": "original_topic",
    "partition": "original_partition",
    "offset": "original_offset",
    "timestamp": "original_timestamp_ms",
}


def _event_attributes(texts: dict[str, str], value: bytes | None) -> dict[str, str]:
    content_type = texts.get("content-type", "").strip().lower()
    if content_type.startswith("application/cloudevents"):
        try:
            document = json.loads(value or b"")
        except (ValueError, UnicodeDecodeError):
            return {}
        if not isinstance(document, dict):
            return {}
        return {
            k: document[k] for k in ("type", "source", "id") if isinstance(document.get(k), str)
        }
    return {k: texts[f"ce_{k}"] for k in ("type", "source", "id") if texts.get(f"ce_{k}")}


@dataclass(frozen=True)
class DlqFilter:
    """Which dead-letter records to take. Empty sets and ``None`` bounds match everything.

    ``error_classes`` entries are a full value (``permanent:ValidationError``), a class name
    (``ValidationError``) or a category (``permanent``, ``exhausted``). Times bound the
    dead-letter record's timestamp (when it was dead-lettered); offsets are inclusive.
    """

    types: frozenset[str] = frozenset()
    sources: frozenset[str] = frozenset()
    error_classes: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None
    partitions: frozenset[int] | None = None
    fingerprints: frozenset[str] = frozenset()
    """Causes (:attr:`DlqRecord.fingerprint_id`): a failure group of ``dlq list --group``."""

    def __post_init__(self) -> None:
        if (
            self.from_offset is not None
            and self.to_offset is not None
            and self.from_offset > self.to_offset
        ):
            raise FilterError(
                f"--from-offset {self.from_offset} is after --to-offset {self.to_offset}"
            )
        if (
            self.since_ms is not None
            and self.until_ms is not None
            and self.since_ms > self.until_ms
        ):
            raise FilterError("--since is later than --until")
        for wanted in self.error_classes:
            category, colon, name = wanted.partition(":")
            if colon and (category not in ERROR_CATEGORIES or not name):
                raise FilterError(
                    f"--error-class {wanted!r}: expected CLASS, CATEGORY or CATEGORY:CLASS "
                    f"with CATEGORY one of {', '.join(ERROR_CATEGORIES)}"
                )

    def matches(self, record: DlqRecord) -> bool:
        """Whether ``record`` passes every condition."""
        if self.types and record.type not in self.types:
            return False
        if self.sources and record.source not in self.sources:
            return False
        if self.error_classes and not any(
            _class_matches(wanted, record.letter.error_class) for wanted in self.error_classes
        ):
            return False
        if self.since_ms is not None and record.timestamp < self.since_ms:
            return False
        if self.until_ms is not None and record.timestamp > self.until_ms:
            return False
        if self.from_offset is not None and record.offset < self.from_offset:
            return False
        if self.to_offset is not None and record.offset > self.to_offset:
            return False
        if self.fingerprints and record.fingerprint_id not in self.fingerprints:
            return False
        return self.partitions is None or record.partition in self.partitions


def _class_matches(wanted: str, actual: str | None) -> bool:
    if actual is None:
        return False
    if ":" in wanted:
        return actual == wanted
    category, _, name = actual.partition(":")
    return wanted in (category, name)


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """What a read covers in one partition: offsets ``[start, stop)`` of ``[first, end)``."""

    partition: int
    first: int
    end: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        """Offsets to read."""
        return max(0, self.stop - self.start)


def newest(ranges: Sequence[PartitionRange], limit: int) -> list[PartitionRange]:
    """``ranges`` cut to their newest ``limit`` offsets in all (the ends of the ranges), shared
    out evenly between partitions; a partition with fewer leaves its share to the others. A
    bounded read for a sample of a big topic, in the ranges' order."""
    share: dict[int, int] = {}
    left, partitions = max(0, limit), len(ranges)
    for span in sorted(ranges, key=lambda span: span.size):
        share[span.partition] = min(span.size, left // partitions)
        left -= share[span.partition]
        partitions -= 1
    return [
        PartitionRange(
            span.partition,
            span.first,
            span.end,
            max(span.start, span.stop - share[span.partition]),
            span.stop,
        )
        for span in ranges
    ]


@dataclass
class DlqReader:
    """Reads dead-letter topics without a consumer group (nothing is committed).

    Use as ``async with DlqReader(KafkaSettings(...)) as reader``. Every broker call is bounded by
    ``timeout`` seconds, and so is a read that makes no progress for that long.
    """

    kafka: KafkaSettings
    timeout: float = DEFAULT_TIMEOUT_S
    client_options: dict[str, Any] = field(default_factory=dict)
    progress: int = 0
    """Offsets covered so far by :meth:`read`, against the sum of :attr:`PartitionRange.size`."""

    def __post_init__(self) -> None:
        request_timeout_ms = max(1000, int(self.timeout * 1000))
        self._admin = AIOKafkaAdminClient(
            **self.kafka.client_options("outboxkit-ops"),
            request_timeout_ms=request_timeout_ms,
            **self.client_options,
        )
        self._consumer = AIOKafkaConsumer(
            **self.kafka.client_options("outboxkit-ops"),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=request_timeout_ms,
            fetch_max_wait_ms=FETCH_WAIT_MS,
            **self.client_options,
        )
        self._topics: dict[str, list[int]] | None = None

    @property
    def bootstrap(self) -> str:
        """The bootstrap servers, for messages."""
        return self.kafka.bootstrap

    async def __aenter__(self) -> DlqReader:
        try:
            async with kafka_bounded(self.kafka, self.timeout, "connecting"):
                await self._admin.start()
                await self._consumer.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Disconnect (safe to call twice, and after a failed start)."""
        try:
            await self._consumer.stop()
        finally:
            await self._admin.close()

    @property
    def admin(self) -> AIOKafkaAdminClient:
        """The admin client, for consumer group look-ups."""
        return self._admin

    @property
    def consumer(self) -> AIOKafkaConsumer:
        """The group-less consumer, for offset look-ups of other topics."""
        return self._consumer

    async def topics(self, refresh: bool = False) -> dict[str, list[int]]:
        """Every topic of the cluster with its partitions (one metadata request for all)."""
        if self._topics is None or refresh:
            async with kafka_bounded(self.kafka, self.timeout, "listing topics"):
                self._topics = await topic_partitions(self._admin)
        return self._topics

    async def partitions(self, topic: str) -> list[int]:
        """The partitions of ``topic``; :class:`UnknownTopicError` if it does not exist."""
        found = (await self.topics()).get(topic)
        if not found:
            raise UnknownTopicError(f"topic {topic!r} does not exist on {self.bootstrap}")
        return found

    async def offsets(self, topic: str, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
        """``{partition: (first offset, end offset)}`` as the broker reports them now."""
        tps = [TopicPartition(topic, p) for p in partitions]
        async with kafka_bounded(self.kafka, self.timeout, f"offsets of {topic}"):
            first = await self._consumer.beginning_offsets(tps)
            end = await self._consumer.end_offsets(tps)
        return {tp.partition: (first[tp], end[tp]) for tp in tps}

    async def first_timestamps(
        self, topic: str, bounds: dict[int, tuple[int, int]]
    ) -> dict[int, int]:
        """The timestamp of the first record each non-empty partition still holds.

        One ListOffsets request for the whole topic: the broker answers "the first record at or
        after time 0" from its time index, starting at the partition's log start, and no record
        is read. ``bounds`` is :meth:`offsets`' answer.
        """
        query = {TopicPartition(topic, p): 0 for p, (first, end) in bounds.items() if end > first}
        if not query:
            return {}
        async with kafka_bounded(self.kafka, self.timeout, f"first timestamps of {topic}"):
            found = await self._consumer.offsets_for_times(query)
        return {tp.partition: hit.timestamp for tp, hit in found.items() if hit is not None}

    async def plan(self, topic: str, wanted: DlqFilter) -> list[PartitionRange]:
        """The offset ranges a read with ``wanted`` covers, per partition, ends taken now."""
        existing = await self.partitions(topic)
        chosen = existing
        if wanted.partitions is not None:
            missing = sorted(wanted.partitions - set(existing))
            if missing:
                raise FilterError(
                    f"partition {missing[0]} does not exist in {topic} "
                    f"(partitions {existing[0]}-{existing[-1]})"
                )
            chosen = sorted(wanted.partitions)
        bounds = await self.offsets(topic, chosen)
        if wanted.from_offset is not None or wanted.to_offset is not None:
            _check_offsets(topic, wanted, bounds)
        starts = {p: max(first, wanted.from_offset or 0) for p, (first, _) in bounds.items()}
        if wanted.since_ms is not None:
            starts = await self._starts_since(topic, bounds, starts, wanted.since_ms)
        ranges = []
        for partition, (first, end) in bounds.items():
            stop = end if wanted.to_offset is None else min(end, wanted.to_offset + 1)
            ranges.append(PartitionRange(partition, first, end, starts[partition], stop))
        return ranges

    async def _starts_since(
        self, topic: str, bounds: dict[int, tuple[int, int]], starts: dict[int, int], since: int
    ) -> dict[int, int]:
        # The broker's time index finds the first record at or after `since`; nothing
        # before it can match, so the read starts there.
        query = {
            TopicPartition(topic, p): since for p, (first, end) in bounds.items() if end > first
        }
        if not query:
            return starts
        async with kafka_bounded(self.kafka, self.timeout, f"offsets by time of {topic}"):
            found = await self._consumer.offsets_for_times(query)
        moved = dict(starts)
        for tp in query:
            hit = found.get(tp)
            moved[tp.partition] = max(
                starts[tp.partition], hit.offset if hit else bounds[tp.partition][1]
            )
        return moved

    async def read(
        self, topic: str, wanted: DlqFilter, ranges: Sequence[PartitionRange] | None = None
    ) -> AsyncIterator[DlqRecord]:
        """Yield the records matching ``wanted``, partition by partition, in offset order."""
        if ranges is None:
            ranges = await self.plan(topic, wanted)
        self.progress = 0
        for span in ranges:
            done = self.progress
            async for record in self._read_range(topic, span):
                self.progress = done + record.offset + 1 - span.start
                parsed = DlqRecord.from_record(record)
                if wanted.matches(parsed):
                    yield parsed
            self.progress = done + span.size

    async def _read_range(self, topic: str, span: PartitionRange) -> AsyncIterator[ConsumerRecord]:
        if span.size == 0:
            return
        tp = TopicPartition(topic, span.partition)
        self._consumer.assign([tp])
        self._consumer.seek(tp, span.start)
        idle_since: float | None = None  # since when fetches return nothing and move nothing
        last_position = -1
        while True:
            async with kafka_bounded(self.kafka, self.timeout, f"reading {topic}"):
                position = await self._consumer.position(tp)
                if position >= span.stop:
                    return
                batch = await self._consumer.getmany(
                    tp, timeout_ms=FETCH_WAIT_MS, max_records=FETCH_MAX_RECORDS
                )
            records = batch.get(tp, [])
            if position != last_position:
                idle_since, last_position = None, position  # past markers or compacted gaps
            if not records:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > self.timeout:
                    raise KafkaUnreachableError(
                        f"kafka at {self.bootstrap} returned nothing from {topic}"
                        f"[{span.partition}] for {self.timeout:g} s at offset {position} "
                        f"(end {span.stop})"
                    )
                continue
            idle_since = None
            for record in records:
                if record.offset >= span.stop:
                    return
                yield record

    async def fetch(self, topic: str, partition: int, offset: int) -> DlqRecord:
        """The record at ``offset``; :class:`OffsetOutOfRangeError` if it is not there."""
        existing = await self.partitions(topic)
        if partition not in existing:
            raise FilterError(
                f"partition {partition} does not exist in {topic} "
                f"(partitions {existing[0]}-{existing[-1]})"
            )
        first, end = (await self.offsets(topic, [partition]))[partition]
        if not first <= offset < end:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range: {_holds(topic, partition, first, end)}"
            )
        span = PartitionRange(partition, first, end, offset, offset + 1)
        async for record in self._read_range(topic, span):
            if record.offset == offset:
                return DlqRecord.from_record(record)
            break
        raise OffsetOutOfRangeError(
            f"no record at offset {offset} of {topic}[{partition}] (removed by compaction?)"
        )


def _holds(topic: str, partition: int, first: int, end: int) -> str:
    if end <= first:
        return f"{topic}[{partition}] is empty"
    return f"{topic}[{partition}] holds offsets {first}-{end - 1}"


def _check_offsets(topic: str, wanted: DlqFilter, bounds: dict[int, tuple[int, int]]) -> None:
    low = wanted.from_offset if wanted.from_offset is not None else 0
    high = wanted.to_offset if wanted.to_offset is not None else float("inf")
    if any(first < end and low <= end - 1 and high >= first for first, end in bounds.values()):
        return
    asked = f"{low}-{wanted.to_offset if wanted.to_offset is not None else 'end'}"
    holds = "; ".join(_holds(topic, p, first, end) for p, (first, end) in sorted(bounds.items()))
    raise OffsetOutOfRangeError(f"offsets {asked} are out of range: {holds}")
