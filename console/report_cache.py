"""One overview report shared by every viewer of the same few seconds.

Each open overview refreshes itself every few seconds; without sharing, ten viewers would make
ten reports (each a dozen database and broker requests; on a million outbox rows the exact
counts alone take hundreds of milliseconds) in those seconds. A report is fresh for ``ttl_s``
seconds from when it began to be read. A viewer who finds it older, but younger than
``ttl_s + stale_s``, is given it at once while one new report is read in the background for
the next viewers; a report older than that (nobody looked for a while) is read while the
viewer waits, and so is every report when ``ttl_s`` is 0 (no sharing). Viewers arriving while
a report is read wait for that one rather than starting their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SharedReport(Generic[T]):
    """``read()``'s answer, read again at most once every ``ttl_s`` seconds (see the module)."""

    def __init__(self, read: Callable[[], Awaitable[T]], ttl_s: float, stale_s: float) -> None:
        self._read = read
        self.ttl_s = ttl_s
        self.stale_s = stale_s
        self._value: T | None = None
        self._read_at = float("-inf")
        self._reading: asyncio.Task[T] | None = None

    async def get(self) -> T:
        """The kept report while it is fresh (or stale but recent: a new one is read behind
        it), else a new one, read once for all who wait."""
        if self.ttl_s <= 0:
            return await self._read()
        age = time.monotonic() - self._read_at
        if self._value is not None and age < self.ttl_s:
            return self._value
        reading = self._start()
        if self._value is not None and age < self.ttl_s + self.stale_s:
            return self._value
        # shield: a viewer who gives up must not cancel the read the others wait for
        return await asyncio.shield(reading)

    async def close(self) -> None:
        """Stop a read in flight (the console's shutdown)."""
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(BaseException):
                await self._reading

    def _start(self) -> asyncio.Task[T]:
        if self._reading is None:
            self._reading = asyncio.create_task(self._read_now())
            self._reading.add_done_callback(_retrieved)
        return self._reading

    async def _read_now(self) -> T:
        began = time.monotonic()
        try:
            self._value = await self._read()
            self._read_at = began
            return self._value
        finally:
            self._reading = None


def _retrieved(task: asyncio.Task[T]) -> None:
    # A background read nobody awaited: its failure shows on the next viewer's own read.
    if not task.cancelled():
        task.exception()
