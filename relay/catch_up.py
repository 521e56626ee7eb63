"""Catching a new logical slot up with the rows written before it existed.

The slot decodes only what commits after its creation; rows already in the table are
published from the table first. The order makes that exact:

1. read ``after``, the highest id in the table, and record the intent
   (``outbox_slot_catch_ups``) so a relay that dies before the end leaves the rest to the
   next one;
2. create the slot. Its consistent point comes after every transaction running when the
   creation began, so a row the slot decodes got its id later: above ``after``;
3. read ``until``, the highest id once the slot exists: a row committed before the slot's
   consistent point has an id up to ``until``;
4. publish the pending, unscheduled rows up to ``until`` in id order (a keyset walk, no lease
   needed to read; the relay renews its leases on the way so no standby takes the slot over
   meanwhile), deleting them as they are acknowledged;
5. drop the intent; stream.

Rows with an id in ``(after, until]`` may have committed after the slot's consistent point:
then the slot decodes them too. The catch-up remembers the ids of that window it published
(:attr:`CatchUp.overlap`) and the stream skips them, so nothing is published twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from outboxkit.outbox.clock import db_now_ms
from outboxkit.outbox.tables import outbox_events, outbox_slot_catch_ups
from outboxkit.relay.claims import PENDING, ClaimedRow, claimed_rows
from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("outboxkit.relay")
PROGRESS_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class CatchUpState:
    """A catch-up recorded in ``outbox_slot_catch_ups``."""

    after_id: int
    until_id: int | None
    published: int


async def load(engine: AsyncEngine, slot: str) -> CatchUpState | None:
    """The catch-up of ``slot`` still to do, if any."""
    table = outbox_slot_catch_ups.c
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(table.after_id, table.until_id, table.published).where(
                    table.slot_name == slot
                )
            )
        ).first()
    return None if row is None else CatchUpState(row.after_id, row.until_id, row.published)


async def highest_id(engine: AsyncEngine) -> int:
    """The highest id in the outbox table (0 when it is empty)."""
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.coalesce(func.max(outbox_events.c.id), 0))) or 0)


async def intend(engine: AsyncEngine, slot: str, after_id: int) -> None:
    """Record that ``slot`` is about to be created and needs a catch-up."""
    values = {"after_id": after_id, "until_id": None, "published": 0}
    statement = insert(outbox_slot_catch_ups).values(
        slot_name=slot, started_ms=db_now_ms("postgresql"), **values
    )
    async with engine.begin() as conn:
        await conn.execute(
            statement.on_conflict_do_update(index_elements=["slot_name"], set_=values)
        )


async def bound(engine: AsyncEngine, slot: str) -> int:
    """Record and return ``until``: the highest id now that the slot exists."""
    until = await highest_id(engine)
    await _update(engine, slot, until_id=until)
    return until


async def finish(engine: AsyncEngine, slot: str) -> None:
    """The catch-up of ``slot`` is done."""
    async with engine.begin() as conn:
        await conn.execute(
            outbox_slot_catch_ups.delete().where(outbox_slot_catch_ups.c.slot_name == slot)
        )


async def _update(engine: AsyncEngine, slot: str, **values: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            update(outbox_slot_catch_ups)
            .where(outbox_slot_catch_ups.c.slot_name == slot)
            .values(**values)
        )


@dataclass
class CatchUp:
    """Publishes the rows of one slot's catch-up, through ``publish`` (which publishes a batch
    and settles it: published rows deleted, failed ones handed to the table's retries; it
    returns the ids published), calling ``keep_leases`` at least every ``renew_every_s``."""

    engine: AsyncEngine
    slot: str
    batch_size: int
    publish: Callable[[list[ClaimedRow]], Awaitable[list[int]]]
    keep_leases: Callable[[], Awaitable[None]]
    renew_every_s: float
    on_progress: Callable[[int, int], None]  # (published, to publish): for /readyz
    # Ids in (after, until] published here: the stream may decode them too and skips them.
    overlap: set[int] = field(default_factory=set)

    async def run(self, state: CatchUpState, until: int) -> int:
        """Publish every pending, unscheduled row up to ``until``; return how many."""
        rows = outbox_events.c
        wanted = (
            PENDING,
            rows.deliver_at_ms.is_(None),
            rows.last_error.is_(None),  # handed over to the table's retries already
            rows.id <= until,
        )
        read = (
            select(rows.id, rows.topic, rows.kafka_key, rows.headers, rows.payload, rows.attempts)
            .where(*wanted)
            .order_by(rows.id)
            .limit(self.batch_size)
        )
        async with self.engine.connect() as conn:
            left = int(
                await conn.scalar(select(func.count()).select_from(outbox_events).where(*wanted))
                or 0
            )
        self.on_progress(0, left)
        log.info(
            "catch-up of slot %s: publishing %d rows written before it (ids up to %d)",
            self.slot,
            left,
            until,
        )
        started = time.monotonic()
        next_renewal = started + self.renew_every_s
        next_report = started + PROGRESS_EVERY_S
        published = 0

        async def after(cursor: int) -> list[ClaimedRow]:
            async with self.engine.connect() as conn:
                return claimed_rows((await conn.execute(read.where(rows.id > cursor))).all())

        batch = await after(0)
        while batch:
            if time.monotonic() >= next_renewal:
                await self.keep_leases()
                next_renewal = time.monotonic() + self.renew_every_s
            # The next batch is read while this one is in flight (keyset: past its last id).
            sending = asyncio.ensure_future(self.publish(batch))
            try:
                next_batch = await after(batch[-1].id)
            finally:
                ids = await sending
            self.overlap.update(row_id for row_id in ids if row_id > state.after_id)
            published += len(ids)
            self.on_progress(published, left)
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + PROGRESS_EVERY_S
                await _update(self.engine, self.slot, published=state.published + published)
                log.info(
                    "catch-up of slot %s: %d of %d rows published (%.0f rows/s)",
                    self.slot,
                    published,
                    left,
                    published / max(1e-9, time.monotonic() - started),
                )
            batch = next_batch
        await finish(self.engine, self.slot)
        log.info(
            "catch-up of slot %s done: %d rows published in %.1f s",
            self.slot,
            published,
            time.monotonic() - started,
        )
        return published
