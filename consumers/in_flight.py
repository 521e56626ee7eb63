"""The handler calls running right now, for the stop deadline's log line.

Read from the event loop and from a watchdog thread (``outboxkit consume``); entries are
immutable and the registry is a plain dict, so a reader sees a consistent snapshot.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from aiokafka import ConsumerRecord
from outboxkit.consumers.app import Handler


@dataclass(frozen=True, slots=True)
class HandlerCall:
    """One handler call in progress: which handler, which record(s), since when."""

    handler: str
    type: str
    topic: str
    partition: int
    offset: int
    records: int
    started: float

    def describe(self, now: float | None = None) -> str:
        """``order.placed handler billing.on_order on orders[0]@41 running for 12 s``."""
        running = (time.monotonic() if now is None else now) - self.started
        more = f" (+{self.records - 1} more)" if self.records > 1 else ""
        return (
            f"{self.type} handler {self.handler} on {self.topic}[{self.partition}]@{self.offset}"
            f"{more} running for {running:.0f} s"
        )


class InFlight:
    """The handler calls of one runtime in progress (never a payload)."""

    def __init__(self) -> None:
        self._calls: dict[int, HandlerCall] = {}
        self._ids = itertools.count()

    @contextlib.contextmanager
    def running(self, handler: Handler, records: Sequence[ConsumerRecord]) -> Iterator[None]:
        """Register a call of ``handler`` for ``records`` (in offset order) while it runs."""
        first = records[0]
        call_id = next(self._ids)
        self._calls[call_id] = HandlerCall(
            handler.name,
            handler.type,
            first.topic,
            first.partition,
            first.offset,
            len(records),
            time.monotonic(),
        )
        try:
            yield
        finally:
            del self._calls[call_id]

    def calls(self) -> list[HandlerCall]:
        """The calls in progress, oldest first."""
        return sorted(list(self._calls.values()), key=lambda call: call.started)
