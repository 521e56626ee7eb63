"""A worker process's loop: claim due instances, advance them, sleep until woken or due.

Several workers run side by side (leases keep them off each other's instances). A worker holds
no instance between steps, so a deploy loses nothing: an instance whose worker died is claimed
again when its lease runs out, and its state runs again, replaying the effects already made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from outboxkit.actions.store import new_holder
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.shared_listen import shared_listening
from outboxkit.workflows.engine import WorkflowEngine
from outboxkit.workflows.store import NOTIFY_CHANNEL
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("outboxkit.workflows")


class WorkflowWorker:
    """Runs an engine's due steps until stopped: the Relay's lifecycle (start, stop, run).

    ``batch`` instances are claimed and advanced at once; with nothing due, the worker sleeps
    ``poll_interval_s`` or until PostgreSQL notifies a runnable instance. A database outage is
    retried with backoff and reported in the log (``outages`` counts them), never swallowed
    silently; the worker goes on when the database is back.
    """

    def __init__(
        self,
        engine: WorkflowEngine,
        *,
        batch: int = 10,
        poll_interval_s: float = 1.0,
        listen: bool = True,
        outage_backoff: Backoff | None = None,
    ) -> None:
        if batch < 1 or poll_interval_s <= 0:
            raise ValueError("batch must be at least 1 and poll_interval_s positive")
        self.engine = engine
        self.batch = batch
        self.poll_interval_s = poll_interval_s
        self.listen = listen
        self.outage_backoff = outage_backoff or Backoff(base_s=0.2, cap_s=10.0, floor_s=0.05)
        self.holder = new_holder()
        self.steps = 0
        self.outages = 0
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Begin working in a background task."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="outboxkit-workflow-worker")

    async def stop(self) -> None:
        """Finish the steps in flight, then stop (idempotent)."""
        self._stopping.set()
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run(self) -> None:
        """Start, and work until :meth:`stop` is called (re-raises a failure of the loop)."""
        await self.start()
        assert self._task is not None
        await self._task

    async def __aenter__(self) -> WorkflowWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _loop(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            await self._listen(stack)
            failures = 0
            while not self._stopping.is_set():
                self._wake.clear()
                try:
                    claimed = await self.engine.run_due(holder=self.holder, limit=self.batch)
                    failures = 0
                except (SQLAlchemyError, OSError) as error:
                    failures += 1
                    self.outages += 1
                    delay = self.outage_backoff.delay(failures)
                    log.warning(
                        "workflow worker: database unavailable (%s); retrying in %.1fs",
                        type(error).__name__,
                        delay,
                    )
                    await self._sleep(delay)
                    continue
                self.steps += claimed
                if claimed < self.batch:
                    await self._sleep(self.poll_interval_s)

    async def _listen(self, stack: contextlib.AsyncExitStack) -> None:
        url = self.engine.sessions.kw.get("bind")
        engine_url = getattr(url, "url", None)
        if not self.listen or engine_url is None or not dialect_of(engine_url).listen_notify:
            return
        wake = self._wake.set
        # The process's one connection for the channel, reopened with backoff if lost.
        await stack.enter_async_context(
            shared_listening(engine_url, NOTIFY_CHANNEL, lambda _payload: wake(), wake)
        )

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
