"""One overview report shared by every viewer of the same few seconds.

Each open overview refreshes itself every few seconds; without sharing, ten viewers would make
ten reports (each a dozen database and broker requests) in those seconds. A report is kept for
``ttl_s`` seconds from when it began to be read, and viewers asking while one is being read
wait for that one rather than starting their own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SharedReport(Generic[T]):
    """``read()``'s answer, read again at most once every ``ttl_s`` seconds."""

    def __init__(self, read: Callable[[], Awaitable[T]], ttl_s: float) -> None:
        self._read = read
        self.ttl_s = ttl_s
        self._value: T | None = None
        self._read_at = float("-inf")
        self._lock = asyncio.Lock()

    async def get(self) -> T:
        """The kept report while it is fresh, else a new one (read once for all waiting)."""
        if self._value is not None and self._fresh():
            return self._value
        async with self._lock:
            if self._value is None or not self._fresh():
                began = time.monotonic()
                self._value = await self._read()
                self._read_at = began
            return self._value

    def _fresh(self) -> bool:
        return time.monotonic() - self._read_at < self.ttl_s
