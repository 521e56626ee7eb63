"""Heartbeats: a running action's lease is extended while it runs, as Temporal does for activities.

A claim's lease is short (default 30 s); while the action runs, a background task extends it
every ``interval_s`` (default a third of the lease) on the database clock. A worker that dies
stops beating and its operation becomes UNKNOWN one lease later, however long its call was
allowed to take. A heartbeat that finds the lease lost (expired, or the operation taken out of
its hands) cancels the action: the worker no longer owns the operation, and the outcome is
UNKNOWN.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from types import TracebackType
from typing import Any, TypeVar

from outboxkit.actions.records import Lease
from outboxkit.actions.store import ActionStore
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

T = TypeVar("T")
log = logging.getLogger("outboxkit.actions")


class LeaseLostError(Exception):
    """Internal: the heartbeat found the lease lost and the action was cancelled."""


class Heartbeat:
    """Extends ``lease`` every ``interval_s`` while inside ``async with``; see :meth:`guard`.

    A failed extension (the database unreachable) is retried at the next beat; the lease counts
    as lost once ``lease_s`` has passed since the last successful one, as the database would
    judge it.

    The beating task starts at the first beat, ``interval_s`` after entering: a call that ends
    sooner (most tool calls) costs a timer handle, not a task, and runs in its caller's task.
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        store: ActionStore,
        lease: Lease,
        *,
        lease_s: float,
        interval_s: float,
    ) -> None:
        if not interval_s > 0:
            raise ValueError("heartbeat_s must be positive")
        self._sessions = sessions
        self._store = store
        self._lease = lease
        self._lease_s = lease_s
        self._interval_s = interval_s
        self._lost = False
        self._first_beat: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._guarded: asyncio.Task[Any] | None = None
        self._cancelled_guarded = False

    async def __aenter__(self) -> Heartbeat:
        started = time.monotonic()
        self._first_beat = asyncio.get_running_loop().call_later(
            self._interval_s, self._start, started
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._first_beat is not None:
            self._first_beat.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def lost(self) -> bool:
        """True once a heartbeat found the lease lost."""
        return self._lost

    async def guard(self, work: Awaitable[T]) -> T:
        """Await ``work`` in this task; if the lease is lost first, cancel it and raise
        :class:`LeaseLostError`. A ``work`` that swallows the cancellation and returns still
        returns its value (the outcome is then recorded, or found stale by the store)."""
        self._guarded = asyncio.current_task()
        try:
            value = await work
        except asyncio.CancelledError:
            if self._cancelled_guarded and self._guarded is not None:
                self._guarded.uncancel()
                raise LeaseLostError(
                    f"lease on {self._lease.key!r} lost while the action ran"
                ) from None
            raise
        finally:
            guarded, self._guarded = self._guarded, None
        if self._cancelled_guarded and guarded is not None:
            guarded.uncancel()
        return value

    def _start(self, started: float) -> None:
        self._first_beat = None
        self._task = asyncio.create_task(self._beat(started), name="outboxkit-action-heartbeat")

    def _lose(self) -> None:
        self._lost = True
        if self._guarded is not None and not self._cancelled_guarded:
            self._cancelled_guarded = True
            self._guarded.cancel()

    async def _beat(self, last_ok: float) -> None:
        while True:
            try:
                async with self._sessions() as session, session.begin():
                    alive = await self._store.extend_lease(session, self._lease, self._lease_s)
            except Exception as error:  # the database is unreachable: try again next beat
                alive = time.monotonic() - last_ok < self._lease_s
                log.warning("heartbeat of an action failed: %s", type(error).__name__)
            else:
                if alive:
                    last_ok = time.monotonic()
            if not alive:
                self._lose()
                return
            await asyncio.sleep(self._interval_s)
