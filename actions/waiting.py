"""Waiting for an operation another worker is running: woken by its change, polling besides.

On PostgreSQL every change of an operation's state, generation or attempt notifies the
``outboxkit_actions`` channel with the row id (migration ``0006_action_notify``), so a waiter
wakes at the commit of the change. Polling stays as the fallback: an expired lease changes
nothing in the row, and SQLite has no notifications.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.notify import LISTEN_ERRORS, listening
from sqlalchemy.engine import URL

CHANNEL = "outboxkit_actions"
log = logging.getLogger("outboxkit.actions")


class OperationWatch:
    """Set by a notification about one operation; :meth:`wait` returns early when it is."""

    def __init__(self, operation_id: int) -> None:
        self._payload = str(operation_id)
        self._changed = asyncio.Event()

    def notify(self, payload: str) -> None:
        """Called for every notification on the channel; wakes the waiter if it is ours."""
        if payload == self._payload:
            self._changed.set()

    async def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a change; True if one was notified."""
        try:
            await asyncio.wait_for(self._changed.wait(), max(0.0, timeout_s))
        except TimeoutError:
            return False
        finally:
            self._changed.clear()
        return True


@contextlib.asynccontextmanager
async def watch_operation(db_url: URL, operation_id: int) -> AsyncIterator[OperationWatch]:
    """Watch one operation: LISTEN on PostgreSQL while inside; on SQLite (or if LISTEN is
    unavailable) the watch is never woken and the waiter polls."""
    watch = OperationWatch(operation_id)
    async with contextlib.AsyncExitStack() as stack:
        if dialect_of(db_url).listen_notify:
            try:
                await stack.enter_async_context(listening(db_url, CHANNEL, watch.notify))
            except LISTEN_ERRORS as error:
                log.warning("LISTEN unavailable, polling the operation: %s", type(error).__name__)
        yield watch
