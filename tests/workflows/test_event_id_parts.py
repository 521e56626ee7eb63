"""Event ids built from a tenant and a workflow id cannot collide: each part is escaped."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st
from outboxkit.actions.events import event_id as action_event_id
from outboxkit.actions.records import idempotency_key
from outboxkit.actions.states import State
from outboxkit.outbox import Outbox
from outboxkit.outbox.tables import outbox_events
from outboxkit.workflows.events import timer_event, transition_event
from sqlalchemy import func, select

from tests.support.actions import sessions_for

SOURCE = "outboxkit/workflows"
parts = st.text(alphabet="ab/%:2F", min_size=1, max_size=8)


@given(parts, parts, parts, parts, st.integers(0, 3), st.integers(0, 3))
@example("a/b", "c", "a", "b/c", 1, 1)
def test_transition_ids_are_distinct_per_tenant_and_workflow(
    t1: str, w1: str, t2: str, w2: str, s1: int, s2: int
) -> None:
    if (t1, w1, s1) != (t2, w2, s2):
        a = transition_event(SOURCE, t1, w1, s1, {}).get_id()
        assert a != transition_event(SOURCE, t2, w2, s2, {}).get_id()


@given(parts, parts, parts, parts)
@example("a/b", "c", "a", "b/c")
def test_timer_ids_never_equal_each_other_or_a_transition(
    t1: str, c1: str, t2: str, c2: str
) -> None:
    timer = timer_event(SOURCE, t1, "w", c1, "deadline", secret="").get_id()
    if (t1, c1) != (t2, c2):
        assert timer != timer_event(SOURCE, t2, "w", c2, "deadline", secret="").get_id()
    assert timer != transition_event(SOURCE, t2, c2, 0, {}).get_id()


async def test_two_instances_split_differently_are_two_outbox_rows(sqlite_url: str) -> None:
    # Before: tenant "a/b" with workflow "c" and tenant "a" with workflow "b/c" both had the
    # id "a/b/c/1", and the outbox kept one of the two events.
    first = transition_event(SOURCE, "a/b", "c", 1, {"n": 1})
    second = transition_event(SOURCE, "a", "b/c", 1, {"n": 2})
    async with sessions_for(sqlite_url) as sessions:
        async with sessions() as session, session.begin():
            await Outbox().add_async(session, first, topic="events")
            await Outbox().add_async(session, second, topic="events")
        async with sessions() as session:
            rows = await session.scalar(select(func.count()).select_from(outbox_events))
    assert rows == 2


def test_plain_ids_are_unchanged() -> None:
    assert transition_event(SOURCE, "acme", "PO-1", 3, {}).get_id() == "acme/PO-1/3"


@given(
    st.text(alphabet="k/:g1a>", min_size=1, max_size=8),
    st.text(alphabet="k/:g1a>", min_size=1, max_size=8),
    st.integers(1, 12),
    st.integers(1, 12),
)
def test_action_ids_and_keys_are_injective(k1: str, k2: str, g1: int, g2: int) -> None:
    # Reviewed, no change needed: the tenant cannot hold "/", and what follows the key has a
    # fixed form (integers, state names), so the key is what lies between them.
    if (k1, g1) != (k2, g2):
        assert idempotency_key(k1, g1) != idempotency_key(k2, g2)
        a = action_event_id("t", k1, g1, 1, None, State.PENDING)
        assert a != action_event_id("t", k2, g2, 1, None, State.PENDING)
