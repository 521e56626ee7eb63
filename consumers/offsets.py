"""Committing the consumer's Kafka offsets in the background, after the database commit.

One commit request is in flight at a time; offsets queued meanwhile go together in the next one,
so the partitions never wait for the broker's answer (a few ms). A revocation and the shutdown
wait for the queue to drain (:meth:`OffsetCommitter.flush`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata
from outboxkit.consumers.metrics import ConsumerStats

log = logging.getLogger("outboxkit.consumer")

COMMIT_TIMEOUT_S = 30.0
# The commit's metadata string says when it was made, so ``outboxkit status`` can tell a group
# that stopped committing from outside (Kafka keeps no commit time it would answer with).
_STAMP = "outboxkit:committed_ms="


def commit_stamp(now_ms: int | None = None) -> str:
    """The metadata string of an offset commit made at ``now_ms`` (default: now)."""
    return f"{_STAMP}{now_ms if now_ms is not None else int(time.time() * 1000)}"


def committed_ms(metadata: str | None) -> int | None:
    """When a commit was made, from its metadata string; ``None`` if not outboxkit's."""
    if not metadata or not metadata.startswith(_STAMP):
        return None
    digits = metadata[len(_STAMP) :]
    return int(digits) if digits.isdigit() else None


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
        # When each partition's offset was last committed (monotonic): the stall watch.
        self.committed_at: dict[TopicPartition, float] = {}

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
            stamp = commit_stamp()
            stamped = {tp: OffsetAndMetadata(offset, stamp) for tp, offset in offsets.items()}
            await asyncio.wait_for(self._consumer.commit(stamped), COMMIT_TIMEOUT_S)
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
        now = time.monotonic()
        for tp in offsets:
            self.committed_at[tp] = now
        if self._failing:
            self._failing = False
            log.info("offset commits succeed again")
