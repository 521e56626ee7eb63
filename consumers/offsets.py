"""Committing the consumer's Kafka offsets in the background, after the database commit.

One commit request is in flight at a time; offsets queued meanwhile go together in the next one,
so the partitions never wait for the broker's answer (a few ms). A revocation and the shutdown
wait for the queue to drain (:meth:`OffsetCommitter.flush`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from outboxkit.consumers.metrics import ConsumerStats

log = logging.getLogger("outboxkit.consumer")

COMMIT_TIMEOUT_S = 30.0


def describe_partitions(partitions: Iterable[TopicPartition]) -> str:
    """``topic[0, 2], other[1]``, for logs."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ", ".join(f"{t}{sorted(p)}" for t, p in sorted(by_topic.items())) or "none"


class OffsetCommitter:
    """The offset-commit queue of one consumer; successful commits are counted in ``stats``."""

    def __init__(self, consumer: AIOKafkaConsumer, stats: ConsumerStats) -> None:
        self._consumer = consumer
        self._stats = stats
        self._offsets: dict[TopicPartition, int] = {}
        self._committer: asyncio.Task[None] | None = None
        self._failing = False

    def commit(self, tp: TopicPartition, offset: int) -> None:
        """Have ``tp``'s ``offset`` committed in the background, with any others queued.

        The caller has committed the database transaction and delivered the dead letters of
        everything before ``offset``.
        """
        self._offsets[tp] = offset
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_queued())

    async def flush(self) -> None:
        """Wait until every queued offset is committed (or its commit failed)."""
        if self._committer is not None:
            await self._committer

    async def _commit_queued(self) -> None:
        while self._offsets:
            offsets, self._offsets = self._offsets, {}
            await self._commit_now(offsets)

    async def _commit_now(self, offsets: dict[TopicPartition, int]) -> None:
        try:
            await asyncio.wait_for(self._consumer.commit(offsets), COMMIT_TIMEOUT_S)
        except (CommitFailedError, IllegalStateError) as error:
            # The partition moved to another member; it resumes from the last committed offset
            # and the inbox skips what this process already applied.
            log.info(
                "offset commit for %s refused: %s",
                describe_partitions(offsets),
                type(error).__name__,
            )
            return
        except (KafkaError, TimeoutError) as error:
            if not self._failing:
                self._failing = True
                log.warning("offset commits failing (%s); will retry", type(error).__name__)
            return
        self._stats.offset_commits += 1
        if self._failing:
            self._failing = False
            log.info("offset commits succeed again")
