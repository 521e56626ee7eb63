"""The consumer app of the chaos run: one effect row per applied event (no unique key).

The topic comes from ``OUTBOXKIT_CHAOS_TOPIC``. Because ``chaos_effects`` has no unique
constraint, an event applied twice would show as two rows: the inbox is what prevents it.

One handler call in the whole run hangs (never returns): the first to create the file named by
``OUTBOXKIT_CHAOS_HANG_FILE``, at step :data:`HANG_AT_SEQ` of a key. The handler timeout
(``HANDLER_TIMEOUT_S``) must free its partition; the event is then retried and applied.

The sequence variant (``OUTBOXKIT_CHAOS_ON_DEAD_LETTER=sequence``): the app keeps each key's
order behind a dead letter, and the producers mark a few steps ``bad`` (with the time they
wrote them). A bad step fails permanently (is dead-lettered, blocking its key) until the run's
operator "fixes" it: writes a time later than the step's into the file named by
``OUTBOXKIT_CHAOS_FIXED_FILE``, then replays the letters.
"""

from __future__ import annotations

import asyncio
import os

from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp
from outboxkit.outbox import PermanentError, RetryPolicy
from outboxkit.outbox.backoff import Backoff
from pydantic import BaseModel
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, insert
from sqlalchemy.ext.asyncio import AsyncSession

chaos_metadata = MetaData()
chaos_effects = Table(
    "chaos_effects",
    chaos_metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("event_id", String(64), nullable=False),
    Column("key", String(64), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
)

EVENT_TYPE = "chaos.step"
HANG_AT_SEQ = 20
HANDLER_TIMEOUT_S = 3.0


class Step(BaseModel):
    """The data of a ``chaos.step`` event: the writer's sequence number within its key."""

    key: str
    seq: int
    bad: bool = False
    at: float = 0.0  # when a bad step was written (time.time())


class BadStepError(PermanentError):
    """A step marked bad that the operator has not fixed yet (the sequence variant)."""


app = ConsumerApp(
    name="chaos",
    retry=RetryPolicy(max_attempts=20, backoff=Backoff(base_s=0.05, cap_s=1.0), max_elapsed_s=120),
    # A SIGKILLed member is noticed after the session timeout: keep it short for the run.
    consumer_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
    retention_interval_s=None,
    handler_timeout_s=HANDLER_TIMEOUT_S,
    on_dead_letter=os.environ.get("OUTBOXKIT_CHAOS_ON_DEAD_LETTER", "continue"),
)


def _fixed(step: Step) -> bool:
    """Whether the operator fixed the bad ``step`` (fixed the steps written before a time)."""
    path = os.environ.get("OUTBOXKIT_CHAOS_FIXED_FILE")
    try:
        with open(path or "") as fixed:
            return step.at < float(fixed.read() or 0)
    except FileNotFoundError:
        return False


def _first_to_hang() -> bool:
    """Whether this call is the one of the run that hangs (creates the hang file first)."""
    path = os.environ.get("OUTBOXKIT_CHAOS_HANG_FILE")
    if not path:
        return False
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


@app.handler(EVENT_TYPE, topic=os.environ.get("OUTBOXKIT_CHAOS_TOPIC", "chaos"))
async def apply_step(step: Step, event: CloudEvent, session: AsyncSession) -> None:
    """Record that this step was applied (hanging once in the run, see the module's notes)."""
    if step.seq == HANG_AT_SEQ and _first_to_hang():
        await asyncio.Event().wait()  # never returns: the handler timeout cancels it
    if step.bad and not _fixed(step):
        raise BadStepError(f"step {step.seq} of {step.key} is marked bad and not fixed yet")
    await session.execute(
        insert(chaos_effects).values(
            event_id=event.get_id(), key=step.key, seq=step.seq, pid=os.getpid()
        )
    )
