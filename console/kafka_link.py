"""The console's connection to Kafka: one admin client and one consumer (a
:class:`~outboxkit.ops.dlq.reader.DlqReader`) kept for the process's life.

Connecting costs more than the requests a page makes, so the console connects at start-up and
keeps the clients. When the broker stops answering, the clients are closed and the next page
connects again, but not sooner than a backoff (1 s, doubling up to 30 s, back to 1 s once it
answers): until then a page is told at once why the broker is unreachable, and shows it so,
instead of waiting for a connection that has just failed.

Reading records moves the consumer (assign, seek), so a page that reads letters takes the
clients alone (:meth:`KafkaLink.reading`); offset and metadata requests share them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from outboxkit.ops.access import KafkaUnreachableError, OpsError
from outboxkit.ops.dlq.reader import DlqReader
from outboxkit.ops.status import Unreachable, connect_kafka
from outboxkit.outbox.kafka_settings import KafkaSettings

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0


class KafkaLink:
    """A kept :class:`DlqReader`, connected again after an outage (see the module)."""

    def __init__(self, kafka: KafkaSettings, timeout: float) -> None:
        self.kafka = kafka
        self.timeout = timeout
        self._reader: DlqReader | None = None
        self._down: Unreachable | None = None
        self._retry_at = 0.0
        self._backoff_s = FIRST_BACKOFF_S
        self._connecting: asyncio.Task[DlqReader | Unreachable] | None = None
        self._exclusive = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Begin connecting in the background (the console's start-up does not wait for it)."""
        self._connect_task()

    async def reader(self) -> DlqReader | Unreachable:
        """The connected reader, or why there is none (a recent failure within its backoff,
        or this attempt's)."""
        if self._reader is not None:
            return self._reader
        if self._connecting is None and time.monotonic() < self._retry_at and self._down:
            return self._down
        # shield: a page that gives up must not cancel the connection other pages wait on
        return await asyncio.shield(self._connect_task())

    def failed(self, cause: Unreachable) -> None:
        """The broker stopped answering a kept reader: drop it and wait out the backoff."""
        reader, self._reader = self._reader, None
        self._fail(cause)
        if reader is not None:
            task = asyncio.create_task(reader.close())
            self._closing.add(task)
            task.add_done_callback(self._closed)

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[DlqReader]:
        """The reader for this block alone, to read records; its assignment is dropped after.
        A broker that is unreachable raises :class:`OpsError` (the page shows it)."""
        async with self._exclusive:
            found = await self.reader()
            if isinstance(found, Unreachable):
                raise OpsError(found.cause)
            try:
                await found.topics(refresh=True)  # topics created since the last page
                yield found
            except KafkaUnreachableError as error:
                self.failed(Unreachable(str(error)))
                raise
            finally:
                if self._reader is found:  # (not one closed since)
                    found.consumer.unsubscribe()  # no background fetching for a page done

    async def close(self) -> None:
        """Disconnect (the console's shutdown)."""
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(BaseException):
                await self._connecting
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.close()
        for task in list(self._closing):
            with contextlib.suppress(BaseException):
                await task

    def _closed(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        if not task.cancelled():
            task.exception()  # closed as far as a broker that is down lets it: nothing to do

    def _connect_task(self) -> asyncio.Task[DlqReader | Unreachable]:
        if self._connecting is None:
            self._connecting = asyncio.create_task(self._connect())
        return self._connecting

    async def _connect(self) -> DlqReader | Unreachable:
        try:
            found = await connect_kafka(self.kafka, self.timeout)
        finally:
            self._connecting = None
        if isinstance(found, Unreachable):
            self._fail(found)
        else:
            self._reader, self._down, self._backoff_s = found, None, FIRST_BACKOFF_S
        return found

    def _fail(self, cause: Unreachable) -> None:
        self._down = cause
        self._retry_at = time.monotonic() + self._backoff_s
        self._backoff_s = min(MAX_BACKOFF_S, self._backoff_s * 2)
