"""A steady flow of outbox events through a URL, and what the HA tests measure around faults."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TypeVar

from aiokafka import ConsumerRecord
from cloudevents.core.v1.event import CloudEvent
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.tables import outbox_events
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

KEYS = 20
T = TypeVar("T")
PAUSE_S = 0.02


@dataclass
class Fault:
    """A switchover or failover: when it began and when the cluster had settled again."""

    kind: str
    began: float
    settled: float = 0.0


class SteadyWriter(threading.Thread):
    """Writes ``per_tx`` events a transaction through ``url`` until :meth:`stop`, the way an
    application does: a failed transaction is logged and the next one tried on a new
    connection. Seqs are never reused, so a commit that failed ambiguously is one row or none.

    ``acknowledged`` holds the seqs whose commit returned; ``commits`` (wall clock) when.
    """

    def __init__(
        self,
        url: str,
        topic: str,
        per_tx: int = 5,
        make_event: Callable[[int], CloudEvent] | None = None,
        pause_s: float = PAUSE_S,
    ) -> None:
        super().__init__(daemon=True, name="steady-writer")
        self.url = url
        self.topic = topic
        self.per_tx = per_tx
        self.make_event = make_event or sequence_event
        self.pause_s = pause_s
        self.acknowledged: list[int] = []
        self.commits: list[float] = []
        self.errors: list[tuple[float, float, str]] = []  # began, seconds it took, message
        self.slow: list[tuple[float, float]] = []  # commits that took over a second: began, s
        self._next = 0
        self._halt = threading.Event()

    def run(self) -> None:
        engine = make_engine(self.url, pool_pre_ping=True, connect_args={"connect_timeout": 3})
        outbox = Outbox(default_topic=self.topic)
        try:
            while not self._halt.is_set():
                seqs = list(range(self._next, self._next + self.per_tx))
                began = time.time()
                self._next += self.per_tx
                try:
                    with Session(engine) as session, session.begin():
                        for seq in seqs:
                            outbox.add(session, self.make_event(seq))
                except DBAPIError as error:
                    self.errors.append((began, time.time() - began, first_line(error)))
                    self._halt.wait(0.1)
                    continue
                self.acknowledged.extend(seqs)
                self.commits.append(time.time())
                if self.commits[-1] - began > 1:
                    self.slow.append((began, self.commits[-1] - began))
                self._halt.wait(self.pause_s)
        finally:
            engine.dispose()

    def stop(self) -> None:
        """Stop after the transaction in flight."""
        self._halt.set()
        self.join(30)


def sequence_event(seq: int) -> CloudEvent:
    """Event number ``seq``, keyed round-robin over :data:`KEYS` keys."""
    return new_event("seq", "/ha", {"seq": seq}, partitionkey=f"key-{seq % KEYS}")


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__


def unless_switching(probe: Callable[[], T], meanwhile: T) -> T:
    """``probe()``, or ``meanwhile`` while the database cannot be reached (a probe of a test
    that waits on a condition must not fail the test while the primary moves)."""
    try:
        return probe()
    except DBAPIError:
        return meanwhile


def outbox_rows(url: str, field: str = "seq") -> tuple[list[int], int]:
    """The seqs (the payload's ``field``) of every outbox row, and how many rows are still
    unpublished."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            payloads = conn.scalars(select(outbox_events.c.payload)).all()
            unpublished = conn.scalar(
                select(func.count())
                .select_from(outbox_events)
                .where(outbox_events.c.published_ms.is_(None))
            )
    finally:
        engine.dispose()
    return [json.loads(payload)[field] for payload in payloads], int(unpublished or 0)


def published_times(url: str) -> list[float]:
    """When (wall clock, seconds) each published row was published, in order."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.scalars(
                select(outbox_events.c.published_ms)
                .where(outbox_events.c.published_ms.is_not(None))
                .order_by(outbox_events.c.published_ms)
            ).all()
    finally:
        engine.dispose()
    return [ms / 1000 for ms in found]


def outage(times: Iterable[float], fault: Fault, until: float | None = None) -> float:
    """Seconds from the start of ``fault`` to the first success (a commit, a publish...) after
    the longest silence between the fault's start and ``until`` (default: 30 s after it
    settled; pass the next fault's start): the outage a client saw."""
    end = fault.settled + 30 if until is None else until
    inside = sorted(t for t in times if fault.began <= t <= end)
    if not inside:
        return float("inf")
    points = [fault.began, *inside]
    gaps = [(b - a, b) for a, b in pairwise(points)]
    _, first_after = max(gaps)
    return first_after - fault.began


def outages(times: Iterable[float], faults: list[Fault]) -> dict[str, float]:
    """:func:`outage` of each fault (each window ends where the next fault begins), by
    ``KIND_N``, in seconds rounded to 0.01."""
    seen = sorted(times)
    ends = [f.began for f in faults[1:]] + [faults[-1].settled + 30] if faults else []
    return {
        f"{fault.kind}_{index + 1}": round(outage(seen, fault, end), 2)
        for index, (fault, end) in enumerate(zip(faults, ends, strict=True))
    }


@dataclass
class Delivery:
    """What reached Kafka, against what the database holds."""

    distinct: int
    duplicates: int
    missing: list[int] = field(default_factory=list)
    order_broken: list[str] = field(default_factory=list)


def check_delivery(records: list[ConsumerRecord], seqs: Iterable[int]) -> Delivery:
    """Every seq on Kafka, first occurrences in seq order per key."""
    seen: set[int] = set()
    firsts: dict[bytes, list[int]] = defaultdict(list)
    for record in records:
        seq = json.loads(record.value)["seq"]
        if seq not in seen:
            seen.add(seq)
            firsts[record.key].append(seq)
    wanted = set(seqs)
    broken = [key.decode() for key, got in firsts.items() if got != sorted(got)]
    return Delivery(len(seen), len(records) - len(seen), sorted(wanted - seen), broken)


LOG_LEVELS = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b")


def problem_lines(log: Path, since: str = "") -> Counter[str]:
    """The WARNING/ERROR lines of a process log, digits blanked, counted: one entry per cause,
    and a count that shows a tight loop."""
    text = log.read_text(errors="replace")
    if since and since in text:
        text = text[text.index(since) :]
    lines = [line for line in text.splitlines() if LOG_LEVELS.search(line)]
    return Counter(re.sub(r"\d+", "N", line.split(" ", 2)[-1])[:240] for line in lines)
