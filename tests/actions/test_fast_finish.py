"""``ActionStore(durable_finish=False)``: the success of a claim commits without waiting for
the log flush on PostgreSQL, and records exactly what the default records.

The refund goes to the real HTTP payment provider; the tests count its refunds and the rows
the ledger wrote (operation, audit trail, events), on SQLite and PostgreSQL.
"""

from __future__ import annotations

from outboxkit.actions import ActionStore, State, run_action
from sqlalchemy import text

from examples.refund_agent.agent import Ticket
from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import PaymentProvider
from tests.support.actions import audit_of, event_types, sessions_for

T = "acme"


async def _refund_once(db_url: str, store: ActionStore, key: str) -> tuple[int, State]:
    ticket = Ticket(ticket_id=key, charge_id="ch_1", amount_cents=1999)
    with PaymentProvider() as provider:
        payments = PaymentsClient(provider.url, account=T)
        async with sessions_for(db_url) as sessions:

            async def refund(op_key: str):
                return await payments.refund(
                    op_key, charge_id=ticket.charge_id, amount_cents=5, currency="EUR"
                )

            first = await run_action(
                sessions, store, tenant=T, key=key, action_type="refund",
                params={"ticket": key}, action=refund, timeout_s=10,
            )  # fmt: skip
            again = await run_action(
                sessions, store, tenant=T, key=key, action_type="refund",
                params={"ticket": key}, action=refund, timeout_s=10,
            )  # fmt: skip
            assert again.result == first.result and not again.executed
        return provider.refund_count(), first.operation.state


async def test_a_fast_finish_records_what_the_default_records(db_url: str) -> None:
    fast = await _refund_once(db_url, ActionStore(durable_finish=False), "fast")
    default = await _refund_once(db_url, ActionStore(), "default")
    assert fast == default == (1, State.SUCCEEDED)
    assert event_types(db_url, T, "fast") == event_types(db_url, T, "default")
    assert event_types(db_url, T, "fast") == ["requested", "started", "succeeded"]
    assert audit_of(db_url, T, "fast") == audit_of(db_url, T, "default")


async def test_only_the_fast_finish_turns_the_flush_off_on_postgresql(pg_url: str) -> None:
    """The setting is local to the statement's transaction: inside an explicit one, read it
    back after the finish (in autocommit the transaction is the statement itself)."""
    settings = {}
    async with sessions_for(pg_url) as sessions:
        for durable_finish in (True, False):
            store = ActionStore(durable_finish=durable_finish)
            async with sessions() as session, session.begin():
                claimed = await store.claim_new(
                    session, tenant=T, key=f"k-{durable_finish}", action_type="refund",
                    params={}, holder="h",
                )  # fmt: skip
                assert claimed is not None and claimed.lease is not None
                assert (await session.execute(text("SHOW synchronous_commit"))).scalar() == "on"
                done = await store.complete_running(session, claimed.lease, result={"ok": 1})
                assert done is not None and done.state is State.SUCCEEDED
                settings[durable_finish] = (
                    await session.execute(text("SHOW synchronous_commit"))
                ).scalar()
    assert settings == {True: "on", False: "off"}
