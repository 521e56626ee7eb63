"""The consumer app of the chaos run: one effect row per applied event (no unique key).

The topic comes from ``OUTBOXKIT_CHAOS_TOPIC``. Because ``chaos_effects`` has no unique
constraint, an event applied twice would show as two rows: the inbox is what prevents it.
"""

from __future__ import annotations

import os

from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp
from outboxkit.outbox import RetryPolicy
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


class Step(BaseModel):
    """The data of a ``chaos.step`` event: the writer's sequence number within its key."""

    key: str
    seq: int


app = ConsumerApp(
    name="chaos",
    retry=RetryPolicy(max_attempts=20, backoff=Backoff(base_s=0.05, cap_s=1.0), max_elapsed_s=120),
    # A SIGKILLed member is noticed after the session timeout: keep it short for the run.
    consumer_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
    retention_interval_s=None,
)


@app.handler(EVENT_TYPE, topic=os.environ.get("OUTBOXKIT_CHAOS_TOPIC", "chaos"))
async def apply_step(step: Step, event: CloudEvent, session: AsyncSession) -> None:
    """Record that this step was applied."""
    await session.execute(
        insert(chaos_effects).values(
            event_id=event.get_id(), key=step.key, seq=step.seq, pid=os.getpid()
        )
    )
