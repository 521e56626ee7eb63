"""The overview's shared report: viewers of the same seconds share one read, a stale report is
given at once while the next is read behind it, and ``ttl_s=0`` reads for every viewer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from outboxkit.console.report_cache import SharedReport

DEADLINE_S = 30.0


class Reads:
    """A report that is the number of times it was read, each read held until released."""

    def __init__(self) -> None:
        self.count = 0
        self.release = asyncio.Event()

    async def read(self) -> int:
        self.count += 1
        await self.release.wait()
        return self.count


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_viewers_of_the_same_seconds_share_one_read() -> None:
    reads = Reads()
    shared = SharedReport(reads.read, ttl_s=3600, stale_s=0)
    viewers = [asyncio.create_task(shared.get()) for _ in range(5)]
    await until(lambda: reads.count == 1, "the first read started")
    reads.release.set()
    assert await asyncio.gather(*viewers) == [1] * 5
    assert await shared.get() == 1 and reads.count == 1


async def test_a_stale_report_is_given_while_the_next_is_read() -> None:
    reads = Reads()
    reads.release.set()
    shared = SharedReport(reads.read, ttl_s=1e-9, stale_s=3600)
    assert await shared.get() == 1
    reads.release.clear()
    assert await shared.get() == 1  # stale, at once; a read has started behind it
    await until(lambda: reads.count == 2, "the background read started")
    assert await shared.get() == 1  # still being read: not a second one
    reads.release.set()
    deadline = time.monotonic() + DEADLINE_S
    while await shared.get() != 2:  # the next viewers get the new one
        assert time.monotonic() < deadline, "the new report given"
        await asyncio.sleep(0.01)


async def test_without_a_ttl_every_viewer_reads() -> None:
    reads = Reads()
    reads.release.set()
    shared = SharedReport(reads.read, ttl_s=0, stale_s=3600)
    assert [await shared.get() for _ in range(3)] == [1, 2, 3]
