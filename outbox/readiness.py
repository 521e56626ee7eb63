"""What a long-running process (relay, consumer) tells its probes: alive, and ready to work.

The process's event loop updates a :class:`Readiness`; the HTTP server of
:mod:`outboxkit.outbox.metrics_server` reads it from its own thread to answer ``/healthz`` and
``/readyz`` (docs/observability.md#probes). Facts are plain attributes replaced whole, so the
reading thread needs no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

BEAT_INTERVAL_S = 1.0
STALE_AFTER_S = 10.0
PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 5.0
log = logging.getLogger("outboxkit.readiness")


class Readiness:
    """Liveness and readiness facts of one process.

    - alive: the event loop ran the beat task (:meth:`start`) within ``stale_after_s``;
    - ready: started and not stopping, the last database and broker checks succeeded, and
      the work is assigned: ``mark_assigned(n)`` with ``n >= min_assigned`` (the relay needs
      at least one shard lease; a consumer needs to be in its group, with any number of
      partitions, so ``min_assigned=0``).
    """

    def __init__(self, *, assigned_what: str = "partitions", min_assigned: int = 0) -> None:
        self.assigned_what = assigned_what
        self.min_assigned = min_assigned
        self.stale_after_s = STALE_AFTER_S
        self.database: str | None = "not checked yet"  # None: ok; else why not
        self.broker: str | None = "not checked yet"
        self.assigned: int | None = None
        self.stopping = False
        # What the work is doing now, when worth saying (a relay catching its slot up).
        self.stage: str | None = None
        # Other reasons not to be ready, by name (a relay's replication stream refused).
        self.problems: dict[str, str] = {}
        self._beat_at: float | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def mark_database(self, ok: bool, reason: str = "unreachable") -> None:
        """Record the outcome of the last database round trip."""
        self.database = None if ok else reason

    def mark_broker(self, ok: bool, reason: str = "unreachable") -> None:
        """Record the outcome of the last broker round trip."""
        self.broker = None if ok else reason

    @contextlib.contextmanager
    def checking(self, name: str) -> Iterator[None]:
        """Mark ``name`` (``"database"`` or ``"broker"``) by how the block ends: ok, or
        ``unreachable (<error class>)``, the class its log line names (a consumer still
        starting, so ``/readyz`` says why rather than "not checked yet"; no message, which
        may name a host or a user)."""
        mark = self.mark_database if name == "database" else self.mark_broker
        try:
            yield
        except Exception as error:
            mark(False, f"unreachable ({describe_failure(error)})")
            raise
        mark(True)

    def mark_stage(self, stage: str | None) -> None:
        """Record what the work is doing now (``None``: its usual work); shown by ``/readyz``."""
        self.stage = stage

    def mark_problem(self, name: str, reason: str | None) -> None:
        """Record why ``name`` keeps the process from being ready (``None``: it no longer
        does)."""
        problems = dict(self.problems)
        if reason is None:
            problems.pop(name, None)
        else:
            problems[name] = reason
        self.problems = problems

    def mark_assigned(self, count: int | None) -> None:
        """Record how many shard leases or partitions are held (``None``: not in a group)."""
        self.assigned = count

    def start(self, probes: dict[str, Callable[[], Awaitable[Any]]] | None = None) -> None:
        """Beat in the running loop; with ``probes`` (``"database"``, ``"broker"``), also
        run each every :data:`PROBE_INTERVAL_S` and mark its outcome."""
        self.stopping = False
        self._beat_at = time.monotonic()
        self._tasks.append(asyncio.create_task(self._beat(), name="outboxkit-liveness"))
        for name, probe in (probes or {}).items():
            task = asyncio.create_task(self._probe(name, probe), name=f"outboxkit-probe-{name}")
            self._tasks.append(task)

    async def stop(self) -> None:
        """Not ready any more (the process is stopping); stop the background tasks."""
        self.stopping = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def alive(self) -> tuple[bool, dict[str, Any]]:
        """``(alive, body)`` for ``/healthz``."""
        if self._beat_at is None:
            return True, {"status": "ok", "loop": "not started"}
        age = time.monotonic() - self._beat_at
        ok = age <= self.stale_after_s
        return ok, {"status": "ok" if ok else "stale", "loop_beat_age_s": round(age, 1)}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, body)`` for ``/readyz``; the body names what is not ready (no secrets)."""
        problems: dict[str, str] = {}
        if self._beat_at is None:
            problems["process"] = "not started"
        elif self.stopping:
            problems["process"] = "stopping"
        elif not self.alive()[0]:
            problems["process"] = "event loop stalled"
        if self.database is not None:
            problems["database"] = self.database
        if self.broker is not None:
            problems["broker"] = self.broker
        problems.update(self.problems)
        if self.assigned is None:
            problems[self.assigned_what] = "not assigned yet"
        elif self.assigned < self.min_assigned:
            problems[self.assigned_what] = f"{self.assigned} held, needs {self.min_assigned}"
        body: dict[str, Any] = {"status": "ready" if not problems else "not ready"}
        if self.assigned is not None:
            body[f"{self.assigned_what}_held"] = self.assigned
        if self.stage is not None:
            body["stage"] = self.stage
        if problems:
            body["not_ready"] = problems
        return not problems, body

    async def _beat(self) -> None:
        while True:
            self._beat_at = time.monotonic()
            await asyncio.sleep(BEAT_INTERVAL_S)

    async def _probe(self, name: str, probe: Callable[[], Awaitable[Any]]) -> None:
        # One log line when the dependency becomes unreachable and one when it is back, not
        # one per probe; the body of /readyz says the same meanwhile.
        mark = self.mark_database if name == "database" else self.mark_broker
        failing: str | None = None
        while True:
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    await probe()
            except Exception as error:  # any failure means "not reachable"
                reason = describe_failure(error)
                if failing is None:
                    log.warning("%s unavailable: %s; not ready, checking again", name, reason)
                failing = reason
                mark(False, reason)
            else:
                if failing is not None:
                    log.info("%s available again", name)
                failing = None
                mark(True)
            await asyncio.sleep(PROBE_INTERVAL_S)


def describe_failure(error: BaseException) -> str:
    """A short reason for a probe body: the error's class only (messages may hold secrets)."""
    return "timed out" if isinstance(error, TimeoutError) else type(error).__name__
