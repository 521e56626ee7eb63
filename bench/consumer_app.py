"""The consumer the benchmarks run: one effect row per event, stamped with when the handler ran.

By default a batch handler writes a chunk's effect rows with one statement; benches compare it
with a per-event handler (``effect="each"``) and with no effect at all (``effect="none"``).

``outboxkit consume bench.consumer_app:app`` runs it as a process; the input topic comes from
``OUTBOXKIT_BENCH_TOPIC``. In-process benches build their own with :func:`make_app`.
"""

from __future__ import annotations

import os
import time
from typing import Literal

from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp
from outboxkit.outbox.db import make_engine
from pydantic import BaseModel
from sqlalchemy import BigInteger, Column, Double, MetaData, String, Table, insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.pool import NullPool

EVENT_TYPE = "bench.event"

effects_metadata = MetaData()
bench_effects = Table(
    "bench_effects",
    effects_metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("source", String(512), nullable=False),
    Column("event_id", String(256), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("sent_at", Double, nullable=True),
    Column("applied_at", Double, nullable=False),
)


class BenchData(BaseModel):
    """The part of a bench event's data the handler uses (other fields are ignored)."""

    seq: int
    sent_at: float | None = None


def create_effects_table(url: str) -> None:
    """Create ``bench_effects`` in the database at ``url``."""
    engine = make_engine(url, poolclass=NullPool)
    effects_metadata.create_all(engine)
    engine.dispose()


Effect = Literal["batch", "each", "none"]


def make_app(
    topic: str, name: str = "bench", *, effect: Effect = "batch", **options: object
) -> ConsumerApp:
    """A consumer that inserts one ``bench_effects`` row per event of ``topic``.

    ``effect``: ``"batch"`` registers a batch handler writing a chunk's rows in one
    executemany INSERT; ``"each"`` a per-event handler executing one INSERT per event;
    ``"none"`` a per-event handler taking the same arguments but executing no statement, which
    leaves the runtime's own work (decoding, validation, inbox claims, commits).
    """
    app = ConsumerApp(name=name, retention_interval_s=None, **options)  # type: ignore[arg-type]

    def row(item: BenchData, event: CloudEvent, applied_at: float) -> dict[str, object]:
        return {
            "source": event.get_source(),
            "event_id": event.get_id(),
            "seq": item.seq,
            "sent_at": item.sent_at,
            "applied_at": applied_at,
        }

    if effect == "batch":

        @app.batch_handler(EVENT_TYPE, topic=topic)
        async def apply_batch(
            items: list[BenchData], events: list[CloudEvent], session: AsyncSession
        ) -> None:
            now = time.time()
            rows = [row(item, event, now) for item, event in zip(items, events, strict=True)]
            await session.execute(insert(bench_effects), rows)

        return app

    @app.handler(EVENT_TYPE, topic=topic)
    async def apply(item: BenchData, event: CloudEvent, session: AsyncSession) -> None:
        if effect == "each":
            await session.execute(insert(bench_effects).values(row(item, event, time.time())))

    return app


app = make_app(os.environ.get("OUTBOXKIT_BENCH_TOPIC", "bench-input"))
