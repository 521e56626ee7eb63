"""The inbox's claims through PgBouncer in transaction mode: concurrent deliveries of the same
events, each in its consumer's transaction, claim each event once."""

from __future__ import annotations

import asyncio
from collections import Counter

from outboxkit.consumers.inbox import claim_many
from outboxkit.outbox.db import make_async_engine
from outboxkit.testing.pgbouncer import PgBouncer
from sqlalchemy.ext.asyncio import AsyncSession

from tests.consumers.test_inbox_partitions import uuid7_at

DELIVERIES = 20
EVENTS = 50


async def test_concurrent_deliveries_through_the_pooler_claim_each_event_once(
    pgbouncer: PgBouncer, pgbouncer_url: str
) -> None:
    engine = make_async_engine(f"{pgbouncer_url}?pooler=transaction", pool_size=10)
    events = [("/shop", uuid7_at(1_700_000_000_000 + n)) for n in range(EVENTS)]
    try:
        await pgbouncer.fill_pool(pgbouncer_url)

        async def deliver() -> set[tuple[str, str]]:
            async with AsyncSession(engine) as session, session.begin():
                return await claim_many(session, "billing", events)

        claimed = await asyncio.gather(*(deliver() for _ in range(DELIVERIES)))
    finally:
        await engine.dispose()
    counts = Counter(event for fresh in claimed for event in fresh)
    assert counts == dict.fromkeys(events, 1)
