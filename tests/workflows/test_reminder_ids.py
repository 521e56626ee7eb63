"""A reminder is its own outbox row: its id never equals the id of the timer that asked for it."""

from __future__ import annotations

from outboxkit.outbox import Outbox
from outboxkit.outbox.tables import outbox_events
from outboxkit.workflows.events import reminder_event, timer_event
from sqlalchemy import select

from tests.support.actions import sessions_for

CORRELATION = "PO-1:await_approval:4"


async def test_a_reminder_and_its_timer_are_two_outbox_rows(sqlite_url: str) -> None:
    """Both come from the engine's source; the outbox keeps one row per (source, id), so the
    reminder used to be dropped silently as a duplicate of its own timer."""
    timer = timer_event(
        "outboxkit/workflows", "acme", "PO-1", CORRELATION, "reminder", 1, secret="ab" * 32
    )
    reminder = reminder_event("outboxkit/workflows", "acme", "PO-1", CORRELATION, 1, {"n": 1})
    assert timer.get_id() != reminder.get_id()
    async with sessions_for(sqlite_url) as sessions:
        async with sessions() as session, session.begin():
            await Outbox().add_async(session, timer, topic="signals")
            await Outbox().add_async(session, reminder, topic="events")
        async with sessions() as session:
            types = (await session.execute(select(outbox_events.c.type))).scalars().all()
    assert sorted(types) == ["outboxkit.workflow.reminder", "outboxkit.workflow.timer"]
