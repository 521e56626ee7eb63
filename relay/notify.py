"""Waking the relay at once on commit: PostgreSQL LISTEN on the channel the outbox trigger uses."""

from __future__ import annotations

import asyncio

from outboxkit.outbox.shared_listen import shared_listening
from sqlalchemy.engine import URL

CHANNEL = "outboxkit_outbox"


class CommitListener:
    """Sets ``wake`` on every notification, through the process's one LISTEN connection for the
    server and channel (:func:`~outboxkit.outbox.shared_listen.shared_listening`).

    If the connection drops it is reopened with backoff (one WARNING, then ``LISTEN restored``);
    ``wake`` is set on both, and meanwhile the relay polls.
    """

    def __init__(self, db_url: str | URL, wake: asyncio.Event) -> None:
        self._db_url = db_url
        self._wake = wake
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start listening in the background."""
        self._task = asyncio.create_task(self._run(), name="outboxkit-listen")

    async def stop(self) -> None:
        """Stop listening (the connection closes when its last listener leaves)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        wake = self._wake.set
        async with shared_listening(self._db_url, CHANNEL, lambda _payload: wake(), wake):
            wake()  # catch up on anything committed before the connection was up
            await asyncio.Event().wait()  # until stopped
