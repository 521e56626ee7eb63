"""Waiting for an operation another worker is running: woken by its change, polling besides.

On PostgreSQL every change of an operation's state, generation or attempt notifies the
``outboxkit_actions`` channel with the row id (migration ``0006_action_notify``), so a waiter
wakes at the commit of the change. Polling stays as the fallback: an expired lease changes
nothing in the row, and SQLite has no notifications.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.shared_listen import shared_listening
from sqlalchemy.engine import URL

CHANNEL = "outboxkit_actions"


class OperationWatch:
    """Set by a notification about one operation; :meth:`wait` returns early when it is."""

    def __init__(self, operation_id: int) -> None:
        self._payload = str(operation_id)
        self._changed = asyncio.Event()

    def notify(self, payload: str) -> None:
        """Called for every notification on the channel; wakes the waiter if it is ours."""
        if payload == self._payload:
            self._changed.set()

    def wake(self) -> None:
        """Wake the waiter to read the operation now (the LISTEN connection was lost or is back)."""
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
    """Watch one operation: on PostgreSQL, through the process's one LISTEN connection for the
    server (:func:`~outboxkit.outbox.shared_listen.shared_listening`: every waiter of the
    process shares it); a lost connection wakes the waiter to poll. On SQLite the watch is never
    woken and the waiter polls."""
    watch = OperationWatch(operation_id)
    async with contextlib.AsyncExitStack() as stack:
        if dialect_of(db_url).listen_notify:
            await stack.enter_async_context(
                shared_listening(db_url, CHANNEL, watch.notify, watch.wake)
            )
        yield watch
