"""Waking the relay at once on commit: PostgreSQL LISTEN on the channel the outbox trigger uses."""

from __future__ import annotations

import asyncio
import logging

from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.notify import LISTEN_ERRORS, listening
from sqlalchemy.engine import URL

CHANNEL = "outboxkit_outbox"
log = logging.getLogger("outboxkit.relay")


class CommitListener:
    """Keeps one asyncpg connection listening; sets ``wake`` on every notification.

    If the connection drops it reconnects with backoff; meanwhile the relay falls back to polling.
    """

    def __init__(self, db_url: str | URL, wake: asyncio.Event) -> None:
        self._db_url = db_url
        self._wake = wake
        self._task: asyncio.Task[None] | None = None
        self._backoff = Backoff(base_s=0.5, cap_s=15.0, floor_s=0.1)

    def start(self) -> None:
        """Start listening in the background."""
        self._task = asyncio.create_task(self._run(), name="outboxkit-listen")

    async def stop(self) -> None:
        """Stop listening and close the connection."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        attempt = 0
        was_lost = False  # a lost connection is said to be back even if it reconnects at once
        while True:
            try:
                async with listening(self._db_url, CHANNEL, lambda _: self._wake.set()) as lost:
                    if attempt or was_lost:
                        log.info("LISTEN restored")
                    attempt, was_lost = 0, False
                    self._wake.set()  # catch up on anything committed while we were away
                    await lost.wait()
                    log.warning("LISTEN connection lost, polling meanwhile")
                    was_lost = True
            except LISTEN_ERRORS as error:
                attempt += 1
                if attempt == 1:
                    log.warning("LISTEN unavailable, polling meanwhile: %s", error)
                await asyncio.sleep(self._backoff.delay(attempt))
