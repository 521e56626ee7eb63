"""Dead-lettering: the failed record, unchanged, plus headers that say what went wrong.

The record format (header names and :class:`DeadLetter`) is in
:mod:`outboxkit.consumers.dlq_headers`. Delivery uses an idempotent producer
(``acks=all``) and waits for the broker's acknowledgement, because the source offset is
committed only after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaProducer
from outboxkit.consumers.dlq_headers import DeadLetter

__all__ = [
    "DEFAULT_DLQ_TOPIC",
    "DeadLetter",
    "DeadLetterPublisher",
    "dlq_topic_for",
]

DEFAULT_DLQ_TOPIC = "{topic}.dlq"


def dlq_topic_for(pattern: str, topic: str) -> str:
    """The dead-letter topic of ``topic``: ``pattern`` with ``{topic}`` replaced."""
    return pattern.replace("{topic}", topic)


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
                    dlq_topic_for(self.topic_pattern, _topic_of(letter)),
                    value=letter.value,
                    key=letter.key,
                    headers=letter.to_headers(self.group),
                )
                for letter in letters
            ]
            await asyncio.gather(*futures)


def _topic_of(letter: DeadLetter) -> str:
    if letter.topic is None:
        raise ValueError("a dead letter needs the topic of its original record")
    return letter.topic
