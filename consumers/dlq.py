"""Dead-lettering: the failed record, unchanged, plus headers that say what went wrong.

The header names are in :mod:`outboxkit.consumers.dlq_headers`. Delivery uses an idempotent producer
(``acks=all``) and waits for the broker's acknowledgement, because the source offset is
committed only after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from outboxkit.consumers import dlq_headers
from outboxkit.consumers.errors import MAX_MESSAGE_CHARS

DEFAULT_DLQ_TOPIC = "{topic}.dlq"

_OURS = frozenset(dlq_headers.ALL)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record to dead-letter, with the facts its headers carry."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]
    error_class: str
    error_message: str
    attempts: int
    first_failure_ms: int
    last_failure_ms: int


def dlq_topic_for(pattern: str, topic: str) -> str:
    """The dead-letter topic of ``topic``: ``pattern`` with ``{topic}`` replaced."""
    return pattern.replace("{topic}", topic)


def dead_letter_headers(letter: DeadLetter, group: str) -> list[tuple[str, bytes | None]]:
    """The original headers (minus earlier outboxkit ones) followed by the failure headers."""
    facts = {
        dlq_headers.ERROR_CLASS: letter.error_class,
        dlq_headers.ERROR_MESSAGE: letter.error_message[:MAX_MESSAGE_CHARS],
        dlq_headers.ORIGINAL_TOPIC: letter.topic,
        dlq_headers.ORIGINAL_PARTITION: str(letter.partition),
        dlq_headers.ORIGINAL_OFFSET: str(letter.offset),
        dlq_headers.ORIGINAL_TIMESTAMP: str(letter.timestamp),
        dlq_headers.CONSUMER_GROUP: group,
        dlq_headers.ATTEMPTS: str(letter.attempts),
        dlq_headers.FIRST_FAILURE_MS: str(letter.first_failure_ms),
        dlq_headers.LAST_FAILURE_MS: str(letter.last_failure_ms),
    }
    # A record replayed from a dead-letter topic that fails again gets fresh facts, not two.
    kept = [(name, value) for name, value in letter.headers if name not in _OURS]
    return kept + [(name, value.encode("utf-8")) for name, value in facts.items()]


class DeadLetterPublisher:
    """Sends dead letters and waits until the broker has them all."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topic_pattern: str = DEFAULT_DLQ_TOPIC,
        timeout: float = 10.0,
        producer_options: dict[str, Any] | None = None,
    ) -> None:
        self.group = group
        self.topic_pattern = topic_pattern
        self.timeout = timeout
        options: dict[str, Any] = {"client_id": f"outboxkit-dlq-{group}"}
        options.update(producer_options or {})
        options.update(enable_idempotence=True, acks="all")
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **options)

    async def start(self) -> None:
        """Connect to the cluster."""
        await self._producer.start()

    async def stop(self) -> None:
        """Flush and disconnect."""
        await self._producer.stop()

    async def publish(self, letters: Iterable[DeadLetter]) -> None:
        """Send ``letters`` and return once every one is acknowledged; raise otherwise.

        Raises the producer's error, or :class:`TimeoutError` after ``timeout`` seconds. A
        letter acknowledged before a failure may be sent again by the caller's retry: the
        dead-letter topic is at-least-once, like every Kafka topic.
        """
        letters = list(letters)
        if not letters:
            return
        async with asyncio.timeout(self.timeout):
            futures = [
                await self._producer.send(
                    dlq_topic_for(self.topic_pattern, letter.topic),
                    value=letter.value,
                    key=letter.key,
                    headers=dead_letter_headers(letter, self.group),
                )
                for letter in letters
            ]
            await asyncio.gather(*futures)
