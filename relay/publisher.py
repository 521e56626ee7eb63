"""Sending claimed rows to Kafka with an idempotent aiokafka producer, keeping per-key order.

Rows are appended in order to record batches per partition; partitions are sent side by side,
and each partition's batches one after the other, so order within a partition is strict and a
row that fails holds back the rest of its key. Outcomes are sorted into published, failed for
a reason of the row's own (counts an attempt), and released (no attempt counted) because of an
outage or because an earlier row of the same key failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    UnsupportedForMessageFormatError,
)
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from outboxkit.outbox import telemetry
from outboxkit.outbox.kafka_failures import explain, producer_lost
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.secrecy import describe_error
from outboxkit.relay import metrics
from outboxkit.relay.claims import ClaimedRow, Failure

log = logging.getLogger("outboxkit.relay")

# A batch refused with one of these may hold rows that fit on their own: split and sent again.
SIZE_ERRORS = (MessageSizeTooLargeError, RecordTooLargeError, RecordListTooLargeError)
# Errors that belong to the record, not to the broker's health: retrying them soon will fail
# again, so they count an attempt and eventually park the row.
RECORD_ERRORS = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RecordListTooLargeError,
    InvalidTopicError,
    TopicAuthorizationFailedError,
    CorruptRecordException,
    UnsupportedForMessageFormatError,
)


class KafkaUnavailable(Exception):
    """The broker could not be reached; the batch was released untouched."""

    outboxkit_safe_message = True  # its messages are written by outboxkit (outbox/secrecy.py)


@dataclass
class BatchOutcome:
    """What happened to each row of one batch."""

    published: list[ClaimedRow] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)
    released: list[ClaimedRow] = field(default_factory=list)
    outage: BaseException | None = None
    failed_keys: set[bytes] = field(default_factory=set)


class Publisher:
    """An idempotent (acks=all) producer that publishes batches of claimed rows."""

    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        request_timeout_s: float,
        linger_s: float,
        max_batch_bytes: int,
        max_request_size: int,
        client_id: str,
    ) -> None:
        self._kafka = kafka
        self._config = {
            **kafka.client_options(client_id),
            "enable_idempotence": True,
            "acks": "all",
            "request_timeout_ms": round(request_timeout_s * 1000),
            "linger_ms": round(linger_s * 1000),
            "max_batch_size": max_batch_bytes,
            "max_request_size": max_request_size,
        }
        self._producer: AIOKafkaProducer | None = None
        self._partitioner = DefaultPartitioner()
        self._max_request_size = max_request_size
        self._max_batch_bytes = max_batch_bytes
        # Batch sizes learned from topics that refused ours as too large (max.message.bytes).
        self._batch_limits: dict[str, int] = {}
        self._timeout_s = request_timeout_s
        self._ack_deadline_s = 3 * self._timeout_s
        self.recreated = 0  # producers replaced after an outage (each with a new producer id)

    async def start(self) -> None:
        """Connect and get a producer id; raises :class:`KafkaUnavailable` when no broker
        answers, or no producer id comes in time (aiokafka asks for one for ever: a cluster
        without a controller quorum would hold the relay here, silent)."""
        if self._producer is not None:
            return
        producer = AIOKafkaProducer(**self._config)
        try:
            async with asyncio.timeout(self._ack_deadline_s):
                await producer.start()
        except (KafkaError, TimeoutError) as error:
            await _discard(producer, self._timeout_s)
            if isinstance(error, TimeoutError):
                raise KafkaUnavailable(
                    f"no producer id from the cluster within {self._ack_deadline_s:.1f}s"
                ) from error
            raise KafkaUnavailable(await explain(self._kafka, error, self._timeout_s)) from error
        self._producer = producer

    async def ping(self) -> None:
        """One metadata round trip to the broker (for readiness when nothing is published);
        raises :class:`KafkaUnavailable`."""
        await self.start()
        assert self._producer is not None
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._producer.client.fetch_all_metadata()
        except (KafkaError, TimeoutError) as error:
            if isinstance(error, TimeoutError):
                raise KafkaUnavailable(
                    f"no metadata from the cluster within {self._timeout_s:g}s"
                ) from error
            raise KafkaUnavailable(str(error) or type(error).__name__) from error

    async def reset(self) -> None:
        """Drop the producer after an outage; the next start gets a fresh producer id."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await _discard(producer, self._timeout_s)

    async def recreate(self, outage: BaseException) -> KafkaUnavailable:
        """Drop the producer after ``outage`` (the batch's rows were released, no attempt
        counted) and return the error to raise: the caller's outage loop retries with growing
        backoff and logs one line per cause, and the next batch gets a new producer.

        Every outage recreates the producer: after some (an out-of-order sequence number, an
        unknown or fenced producer id, a send whose outcome is unknown) the old one could never
        send again, and after the others a new one costs one round trip.
        """
        await self.reset()
        self.recreated += 1
        cause = producer_lost(outage)
        metrics.PRODUCERS_RECREATED.labels("unavailable" if cause is None else "state_lost").inc()
        text = describe_error(outage, with_class=True)
        if cause is not None:
            return KafkaUnavailable(f"{cause} ({text}); the producer is recreated")
        return KafkaUnavailable(text)

    async def stop(self) -> None:
        """Flush and close the producer."""
        await self.reset()

    async def publish(self, rows: list[ClaimedRow]) -> BatchOutcome:
        """Send ``rows`` in order and sort every row into an outcome.

        Rows are appended to record batches per partition (aiokafka's ``create_batch`` /
        ``send_batch``: about a quarter of ``send``'s CPU per record), partitioned like
        ``send`` does (murmur2 of the key). Each partition's batches go one after the other,
        the next once the previous is acknowledged (aiokafka sends one batch per partition at
        a time anyway), so after a row fails the rest of its key stays behind, released: a key
        never overtakes its own failed row. A batch the broker refuses as too large is split
        and sent again at no cost to its rows; only a row refused alone counts an attempt.
        """
        await self.start()
        producer = self._producer
        assert producer is not None
        outcome = BatchOutcome()
        failed_at: dict[bytes, int] = {}  # key -> position in ``rows`` of its first failure
        missing_topics: dict[str, str] = {}
        partitions_of: dict[str, list[int]] = {}
        # Partition of each key already seen in this call, per topic: murmur2 is pure Python.
        partition_of_key: dict[str, dict[bytes, int]] = {}
        queues: dict[tuple[str, int], deque[_Item]] = {}
        spans: dict[int, Any] = {}
        started = time.perf_counter()
        tracing = telemetry.enabled()
        for index, row in enumerate(rows):
            if row.key is not None and row.key in failed_at:
                outcome.released.append(row)
                continue
            if row.topic in missing_topics:
                self._fail(outcome, failed_at, index, row, missing_topics[row.topic])
                continue
            size = DefaultRecordBatchBuilder.estimate_size_in_bytes(
                row.key, _value(row), row.headers
            )
            if size > self._max_request_size:
                self._fail(
                    outcome,
                    failed_at,
                    index,
                    row,
                    describe_error(_too_large(size), with_class=True),
                )
                continue
            try:
                partitions = partitions_of.get(row.topic)
                if partitions is None:
                    partitions = sorted(await producer.partitions_for(row.topic))
                    partitions_of[row.topic] = partitions
            except UnknownTopicOrPartitionError as error:
                if await self._topic_missing(row.topic):
                    missing_topics[row.topic] = f"topic {row.topic!r} does not exist"
                    self._fail(outcome, failed_at, index, row, missing_topics[row.topic])
                    continue
                outcome.outage = error
            except KafkaError as error:
                outcome.outage = error
            if outcome.outage is not None:
                outcome.released.extend(rows[index:])
                break
            headers = row.headers
            if tracing:
                spans[row.id], headers = _publish_span(row)
            if row.key is None:
                partition = self._partitioner(None, partitions, partitions)
            else:
                known = partition_of_key.setdefault(row.topic, {})
                partition = known.get(row.key, -1)
                if partition < 0:
                    partition = self._partitioner(row.key, partitions, partitions)
                    known[row.key] = partition
            queues.setdefault((row.topic, partition), deque()).append(_Item(index, row, headers))
        if outcome.outage is None:
            chains = [
                self._send_partition(producer, topic, partition, items, outcome, failed_at, spans)
                for (topic, partition), items in queues.items()
            ]
            await asyncio.gather(*chains)
        else:
            outcome.released.extend(item.row for items in queues.values() for item in items)
        metrics.PUBLISH_SECONDS.observe(time.perf_counter() - started)
        outcome.failed_keys.update(failed_at)
        outcome.failed_keys.update(row.key for row in outcome.released if row.key is not None)
        for failure in outcome.failed:
            current = spans.pop(failure.row.id, None)
            telemetry.add_event(current, "publish.failed", {"attempt": failure.row.attempts + 1})
            telemetry.end_span(current, error_class=failure.error.split(":", 1)[0])
        for row in outcome.released:
            current = spans.pop(row.id, None)
            telemetry.add_event(current, "publish.released")
            telemetry.end_span(current)
        return outcome

    async def _send_partition(
        self,
        producer: AIOKafkaProducer,
        topic: str,
        partition: int,
        items: deque[_Item],
        outcome: BatchOutcome,
        failed_at: dict[bytes, int],
        spans: dict[int, Any],
    ) -> None:
        """Send one partition's rows batch after batch, each once the previous is known."""
        while items:
            if outcome.outage is not None:  # another partition saw the broker go away
                outcome.released.extend(item.row for item in items)
                return
            batch = _Batch(producer.create_batch(), topic, partition, self._limit_of(topic))
            while items:
                item = items[0]
                if failed_at and _behind_a_failure(item, failed_at):
                    outcome.released.append(items.popleft().row)
                elif batch.add(item):
                    items.popleft()
                else:
                    break
            if not batch.items:
                continue
            sent = False
            try:
                future = await batch.send(producer)
                sent = True
                result = await self._acknowledgement(future)
            except KafkaError as error:
                result = error
            if sent and isinstance(result, SIZE_ERRORS + RECORD_ERRORS):
                _rewind_sequence(producer, topic, partition, len(batch.items))
            if not isinstance(result, BaseException):
                if not failed_at and not spans:  # the usual case: nothing to check per row
                    outcome.published.extend(item.row for item in batch.items)
                    continue
                base = getattr(result, "offset", -1)
                for item, relative in zip(batch.items, batch.offsets, strict=True):
                    self._published(outcome, failed_at, item, partition, base + relative, spans)
            elif isinstance(result, SIZE_ERRORS) and len(batch.items) > 1:
                # The topic (or the broker) takes smaller batches than ours: learn its limit
                # and send these rows again in smaller batches, in the same order.
                self._batch_limits[topic] = max(1, batch.size // 2)
                log.info(
                    "topic %s refused a batch of %d bytes as too large; sending batches of at "
                    "most %d bytes",
                    topic,
                    batch.size,
                    self._batch_limits[topic],
                )
                items.extendleft(reversed(batch.items))
            elif isinstance(result, RECORD_ERRORS):
                for item in batch.items:
                    self._fail(
                        outcome,
                        failed_at,
                        item.index,
                        item.row,
                        describe_error(result, with_class=True),
                    )
            else:
                outcome.outage = outcome.outage or result
                outcome.released.extend(item.row for item in batch.items)

    def _limit_of(self, topic: str) -> int:
        return self._batch_limits.get(topic, self._max_batch_bytes)

    @staticmethod
    def _published(
        outcome: BatchOutcome,
        failed_at: dict[bytes, int],
        item: _Item,
        partition: int,
        offset: int,
        spans: dict[int, Any],
    ) -> None:
        row = item.row
        telemetry.end_span(
            spans.pop(row.id, None),
            attributes={
                "messaging.destination.partition.id": str(partition),
                "messaging.kafka.offset": offset,
            },
        )
        if _behind_a_failure(item, failed_at):
            # An earlier row of its key (on another topic) failed meanwhile: this one stays
            # published (it is in Kafka) and the failed row will follow it, an inversion.
            log.warning("row %s of a key with a failed earlier row was published", row.id)
        outcome.published.append(row)

    async def _acknowledgement(self, future: asyncio.Future[Any]) -> object:
        """The batch's result or exception; a deadline turns a silent broker into an outage.

        aiokafka retries a batch whose leader is known but unreachable forever, so without this
        deadline a broker that goes away would stall the relay.
        """
        _, late = await asyncio.wait([future], timeout=self._ack_deadline_s)
        if late:
            future.cancel()
            return KafkaTimeoutError(f"no acknowledgement within {self._ack_deadline_s:.1f}s")
        return future.exception() or future.result()

    @staticmethod
    def _fail(
        outcome: BatchOutcome, failed_at: dict[bytes, int], index: int, row: ClaimedRow, error: str
    ) -> None:
        outcome.failed.append(Failure(row, error))
        if row.key is not None:
            failed_at[row.key] = min(index, failed_at.get(row.key, index))

    async def _topic_missing(self, topic: str) -> bool:
        """Whether a broker answers and its metadata has no ``topic``. aiokafka also says
        "unknown topic" when no metadata came in time (during a leader change, say): that is
        an outage, and must not count an attempt."""
        assert self._producer is not None
        try:
            metadata = await asyncio.wait_for(
                self._producer.client.fetch_all_metadata(), self._timeout_s
            )
        except (KafkaError, TimeoutError):
            return False
        return topic not in metadata.topics()


@dataclass(slots=True)
class _Item:
    """A row queued for its partition, its position in the claim and its record headers."""

    index: int
    row: ClaimedRow
    headers: list[tuple[str, bytes]]


def _behind_a_failure(item: _Item, failed_at: dict[bytes, int]) -> bool:
    """True when an earlier row of the item's key failed (the item must not overtake it)."""
    key = item.row.key
    return key is not None and failed_at.get(key, item.index) < item.index


class _Batch:
    """One record batch being filled for a topic partition, and the rows in it."""

    __slots__ = ("builder", "items", "limit", "offsets", "partition", "size", "topic")

    def __init__(self, builder: BatchBuilder, topic: str, partition: int, limit: int) -> None:
        self.builder = builder
        self.topic = topic
        self.partition = partition
        self.limit = limit
        self.size = 0
        self.items: list[_Item] = []
        self.offsets: list[int] = []

    def add(self, item: _Item) -> bool:
        """Append ``item``'s row; ``False`` when the batch is full (a first record always fits)."""
        row = item.row
        value = _value(row)
        if self.items and self.limit < self.builder.size() + DefaultRecordBatchBuilder.size_of(
            row.key, value, item.headers
        ):
            return False
        metadata = self.builder.append(
            key=row.key, value=value, timestamp=None, headers=item.headers
        )
        if metadata is None:
            return False
        self.items.append(item)
        self.offsets.append(metadata.offset)
        return True

    async def send(self, producer: AIOKafkaProducer) -> asyncio.Future[Any]:
        """Queue the batch; the future resolves with its base offset once acknowledged."""
        self.size = self.builder.size()
        future: asyncio.Future[Any] = await producer.send_batch(
            self.builder, self.topic, partition=self.partition
        )
        return future


def _value(row: ClaimedRow) -> bytes | None:
    """The record's value: null for an event without data (Kafka binding 3.2.2), which the
    outbox stores as an empty payload."""
    return row.payload or None


def _too_large(size: int) -> MessageSizeTooLargeError:
    return MessageSizeTooLargeError(
        f"The message is {size} bytes when serialized which is larger than the maximum "
        "request size you have configured with the max_request_size configuration"
    )


def _publish_span(row: ClaimedRow) -> tuple[Any, list[tuple[str, bytes]]]:
    """A producer span joined to the event's originating trace, and the row's headers with
    this hop's ``traceparent``."""
    named = {name: value.decode() for name, value in row.headers}
    current = telemetry.start_span(
        "outbox publish",
        kind="producer",
        parent=telemetry.origin_carrier(named),
        attributes={
            "messaging.system": "kafka",
            "messaging.destination.name": row.topic,
            "cloudevents.event_type": named.get("ce_type"),
            "cloudevents.event_source": named.get("ce_source"),
            "cloudevents.event_id": named.get("ce_id"),
            "outboxkit.attempt": row.attempts + 1,
        },
    )
    hop = telemetry.hop_header(current)
    if hop is None:
        return current, row.headers
    return current, [(k, v) for k, v in row.headers if k != telemetry.HOP_HEADER] + [hop]


def _rewind_sequence(producer: AIOKafkaProducer, topic: str, partition: int, records: int) -> None:
    """Give back the sequence numbers of a batch the broker refused without writing it.

    aiokafka numbers a batch's records when it sends it and never takes the numbers back, so
    after a refused batch (too large, say) the partition's next batch leaves a gap, which the
    broker answers with OutOfOrderSequenceNumber until the producer is replaced (the Java
    client adjusts its sequences after such a failure). Exact because this publisher has one
    batch per partition in flight at a time and waits for its outcome.
    """
    manager = producer._txn_manager  # aiokafka keeps idempotence state there, no public API
    if manager is not None:
        manager.increment_sequence_number(TopicPartition(topic, partition), -records)


async def _discard(producer: AIOKafkaProducer, timeout_s: float) -> None:
    """Close ``producer``, flushing what it holds within ``timeout_s``.

    An idempotent producer never gives a batch up, and ``stop`` waits for every one: with a
    frozen leader it waits for ever, and cancelled it leaves its sender task retrying and its
    connections open (one more zombie per outage). So past the deadline the producer is closed
    without flushing: its batches' rows were released and go again with the next producer (a
    duplicate at worst, which the consumers' inbox absorbs).
    """
    with contextlib.suppress(KafkaError, TimeoutError, OSError):
        await asyncio.wait_for(producer.stop(), timeout_s)
        return
    # aiokafka has no public way to abandon its batches: end the sender task (it lets its
    # requests in flight finish first), then close the connections. Best effort: whatever
    # goes wrong in a producer being thrown away must not stop the relay.
    try:
        if producer._sender is not None:
            await asyncio.wait_for(producer._sender.close(), timeout_s)
    except Exception as error:
        log.debug("discarding a producer: its sender ended with %s", type(error).__name__)
    try:
        await asyncio.wait_for(producer.client.close(), timeout_s)
    except Exception as error:
        log.debug("discarding a producer: closing its client: %s", type(error).__name__)
