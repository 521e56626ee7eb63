"""Dead-lettering: the failed record, unchanged, plus headers that say what went wrong.

The record format (header names and :class:`DeadLetter`) is in
:mod:`outboxkit.consumers.dlq_headers`. Delivery uses an idempotent producer
(``acks=all``) and waits for the broker's acknowledgement, because the source offset is
committed only after it; :class:`DeadLetterDelivery` keeps trying while the topic is unreachable.
A letter refused for a reason of its own (too large with the failure headers added, an invalid
record) is sent again cut down (:func:`shrunk`), marked ``outboxkit-truncated``: retrying it
unchanged could never succeed, and the partition would stop for good.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaProducer, ConsumerRecord
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    KafkaConnectionError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)
from outboxkit.consumers.dlq_headers import DeadLetter
from outboxkit.consumers.errors import error_class
from outboxkit.consumers.metrics import ConsumerStats
from outboxkit.outbox.kafka_failures import explain
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.retry import RetryPolicy
from outboxkit.outbox.secrecy import describe_error

__all__ = [
    "DEFAULT_DLQ_TOPIC",
    "DeadLetter",
    "DeadLetterDelivery",
    "DeadLetterPublisher",
    "dead_letter_for",
    "dlq_topic_for",
    "shrunk",
]

log = logging.getLogger("outboxkit.consumer")

DEFAULT_DLQ_TOPIC = "{topic}.dlq"

# Refusals of the record itself, by the client before sending or by the broker: sending the same
# letter again cannot succeed (an unreachable broker raises other errors, retried as they are).
REFUSED_AS_IS: tuple[type[Exception], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    CorruptRecordException,
    InvalidTimestampError,
)
TRUNCATED_VALUE_BYTES = 64 * 1024
KEPT_HEADER_BYTES = 16 * 1024
LAST_STEP = 3


def dead_letter_for(
    record: ConsumerRecord,
    category: str,
    error: BaseException,
    attempts: int,
    first_ms: int,
    last_ms: int,
) -> DeadLetter:
    """The dead letter of ``record``, which failed ``attempts`` times as ``category``."""
    return DeadLetter(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        timestamp=record.timestamp,
        key=record.key,
        value=record.value,
        headers=tuple(record.headers or ()),
        error_class=error_class(category, error),
        error_message=describe_error(error),
        attempts=attempts,
        first_failure_ms=first_ms,
        last_failure_ms=last_ms,
    )


def shrunk(letter: DeadLetter, step: int) -> DeadLetter:
    """``letter`` cut down for a broker that refused it ``step`` times (0: as it is).

    1: the value cut to its first 64 KiB; 2: no value, and of the original headers only the
    first ones within 16 KiB; 3: no key either. The failure facts always stay, and
    ``truncated``/``original_size`` say what was left out.
    """
    if step <= 0:
        return letter
    size = len(letter.value or b"")
    if step == 1:
        value = None if letter.value is None else letter.value[:TRUNCATED_VALUE_BYTES]
        return dataclasses.replace(letter, value=value, truncated="value", original_size=size)
    kept: list[tuple[str, bytes | None]] = []
    budget = KEPT_HEADER_BYTES if step == 2 else 0
    for name, header in letter.original_headers():
        budget -= len(name.encode("utf-8")) + len(header or b"")
        if budget < 0:
            break
        kept.append((name, header))
    return dataclasses.replace(
        letter,
        value=None,
        headers=tuple(kept),
        key=letter.key if step == 2 else None,
        truncated="value,headers" if step == 2 else "value,headers,key",
        original_size=size,
    )


def dlq_topic_for(pattern: str, topic: str) -> str:
    """The dead-letter topic of ``topic``: ``pattern`` with ``{topic}`` replaced."""
    return pattern.replace("{topic}", topic)


class DeadLetterPublisher:
    """Sends dead letters and waits until the broker has them all."""

    def __init__(
        self,
        kafka: KafkaSettings,
        group: str,
        topic_pattern: str = DEFAULT_DLQ_TOPIC,
        timeout_s: float = 10.0,
        producer_options: dict[str, Any] | None = None,
    ) -> None:
        self.group = group
        self.topic_pattern = topic_pattern
        self.timeout_s = timeout_s
        self.kafka = kafka
        options = kafka.client_options(f"outboxkit-dlq-{group}")
        options.update(producer_options or {})
        options.update(enable_idempotence=True, acks="all")
        self._producer = AIOKafkaProducer(**options)

    async def start(self) -> None:
        """Connect to the cluster; a failure to connect is a ``KafkaConnectionError`` whose
        message names the cause (a rejected password, an untrusted certificate)."""
        try:
            await self._producer.start()
        except KafkaConnectionError as error:
            raise KafkaConnectionError(await explain(self.kafka, error, self.timeout_s)) from error

    async def stop(self) -> None:
        """Flush and disconnect."""
        await self._producer.stop()

    async def publish(self, letters: Iterable[DeadLetter]) -> None:
        """Send ``letters`` and return once every one is acknowledged; raise otherwise.

        A letter refused for a reason of its own (:data:`REFUSED_AS_IS`) is sent again cut
        down (:func:`shrunk`), step by step. Raises the producer's error (an outage, or a
        refusal of the smallest form), or :class:`TimeoutError` after ``timeout_s`` seconds. A
        letter acknowledged before a failure may be sent again by the caller's retry: the
        dead-letter topic is at-least-once, like every Kafka topic.
        """
        todo = [(letter, 0) for letter in letters]
        async with asyncio.timeout(self.timeout_s):
            while todo:
                outcomes = [await self._send(shrunk(letter, step)) for letter, step in todo]
                errors = await asyncio.gather(*(_settled(outcome) for outcome in outcomes))
                again: list[tuple[DeadLetter, int]] = []
                for (letter, step), error in zip(todo, errors, strict=True):
                    if error is None:
                        continue
                    if not isinstance(error, REFUSED_AS_IS) or step >= LAST_STEP:
                        raise error
                    cut = shrunk(letter, step + 1)
                    log.warning(
                        "dead letter of %s[%s]@%s refused by Kafka (%s); sending it without its %s",
                        letter.topic,
                        letter.partition,
                        letter.offset,
                        type(error).__name__,
                        cut.truncated,
                    )
                    again.append((letter, step + 1))
                todo = again

    async def _send(self, letter: DeadLetter) -> asyncio.Future[Any] | Exception:
        """Queue ``letter``: its delivery future, or the client's refusal of it."""
        try:
            future: asyncio.Future[Any] = await self._producer.send(
                dlq_topic_for(self.topic_pattern, _topic_of(letter)),
                value=letter.value,
                key=letter.key,
                headers=letter.to_headers(self.group),
            )
        except REFUSED_AS_IS as error:
            return error
        return future


async def _settled(outcome: asyncio.Future[Any] | Exception) -> Exception | None:
    """The error a send ended with, or ``None`` once the broker acknowledged it."""
    if isinstance(outcome, Exception):
        return outcome
    try:
        await outcome
    except KafkaError as error:
        refused: Exception = error
        return refused
    return None


def _topic_of(letter: DeadLetter) -> str:
    if letter.topic is None:
        raise ValueError("a dead letter needs the topic of its original record")
    return letter.topic


class DeadLetterDelivery:
    """Delivers the dead letters of a runtime, retrying while the topic is unreachable.

    ``retry`` spaces the attempts (its bounds are not used: the source offsets stay uncommitted
    until the letters are delivered, however long that takes). Delivered letters are counted
    in ``stats``.
    """

    def __init__(
        self, publisher: DeadLetterPublisher, retry: RetryPolicy, stats: ConsumerStats
    ) -> None:
        self.publisher = publisher
        self._retry = retry
        self._stats = stats
        self._down = False

    async def deliver(
        self, letters: list[DeadLetter], pause: Callable[[float], Awaitable[bool]]
    ) -> bool:
        """Dead-letter ``letters``, retrying while the topic is unreachable.

        ``pause(seconds)`` waits between attempts and says whether to go on. ``False`` when
        given up because of a stop or a revocation; nothing may be committed then.
        """
        if not letters:
            return True
        failures = 0
        while True:
            try:
                await self.publisher.publish(letters)
            except (KafkaError, TimeoutError, OSError) as error:
                failures += 1
                self._stats.dlq_failures += 1
                if not self._down:
                    self._down = True
                    log.error(
                        "dead-letter topic unreachable (%s); retrying, offsets not committed",
                        type(error).__name__,
                    )
                if not await pause(self._retry.delay(failures)):
                    return False
                continue
            if self._down:
                self._down = False
                log.info("dead-letter topic reachable again")
            self._counted(letters)
            return True

    def _counted(self, letters: list[DeadLetter]) -> None:
        self._stats.dead_lettered += len(letters)
        by_class = self._stats.dead_lettered_by_class
        for letter in letters:
            error = letter.error_class or "-"
            by_class[error] = by_class.get(error, 0) + 1
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
