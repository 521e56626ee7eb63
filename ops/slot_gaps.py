"""WAL-message gaps (relay/failover.py): list them, and acknowledge them once handled.

A gap stays in ``outbox_slot_gaps`` (and keeps ``status`` at exit 1, ``/readyz`` at 503, the
gap metric above zero) until an operator acknowledges it, by id or all at once. The CLI
(``outboxkit outbox gaps``) and the console share these functions.
"""

from __future__ import annotations

from collections.abc import Sequence

from outboxkit.outbox.clock import db_now_ms
from outboxkit.outbox.tables import outbox_slot_gaps
from outboxkit.relay.failover import Gap, gap_of, open_gaps
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["Gap", "acknowledge", "list_gaps"]


async def list_gaps(engine: AsyncEngine, *, acknowledged: bool = False) -> list[Gap]:
    """The gaps not yet acknowledged (oldest first), or every gap with ``acknowledged``."""
    async with engine.connect() as conn:
        if not acknowledged:
            return await open_gaps(conn)
        rows = await conn.execute(select(outbox_slot_gaps).order_by(outbox_slot_gaps.c.id))
        return [gap_of(row) for row in rows]


async def acknowledge(engine: AsyncEngine, ids: Sequence[int] | None, by: str) -> list[int]:
    """Acknowledge the open gaps with these ids (every open gap if ``ids`` is ``None``) in the
    name of ``by``; return the ids acknowledged now."""
    table = outbox_slot_gaps.c
    statement = (
        update(outbox_slot_gaps)
        .where(table.acknowledged_ms.is_(None))
        .values(acknowledged_ms=db_now_ms(engine.dialect.name), acknowledged_by=by[:200])
        .returning(table.id)
    )
    if ids is not None:
        statement = statement.where(table.id.in_(list(ids)))
    async with engine.begin() as conn:
        return sorted(int(row_id) for row_id in (await conn.scalars(statement)).all())
