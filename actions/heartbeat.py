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
from typing import TypeVar

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
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Heartbeat:
        self._task = asyncio.create_task(self._beat(), name="outboxkit-action-heartbeat")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def lost(self) -> bool:
        """True once a heartbeat found the lease lost."""
        return self._lost.is_set()

    async def guard(self, work: Awaitable[T]) -> T:
        """Await ``work``; if the lease is lost first, cancel it, raise :class:`LeaseLostError`."""
        task = asyncio.ensure_future(work)
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled() and self._lost.is_set():
            raise LeaseLostError(f"lease on {self._lease.key!r} lost while the action ran")
        return task.result()

    async def _beat(self) -> None:
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(self._interval_s)
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
                self._lost.set()
                return
