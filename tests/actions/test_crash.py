"""A worker process killed between the side effect and the record update.

The worker is the example's pydantic-ai agent run as its own process (``python -m
examples.refund_agent refund``). The provider commits the refund and holds the reply; the test
SIGKILLs the worker then, so the operation stays RUNNING until its lease expires (no more
heartbeats), becomes UNKNOWN, and is reconciled from the provider's records: one refund,
recorded as SUCCEEDED.
"""

from __future__ import annotations

import os
import subprocess
import sys

from outboxkit.actions import ActionStore, State, reconcile_unknown
from outboxkit.agents import AgentRun

from examples.refund_agent.agent import Ticket, handle_ticket, refund_agent
from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import Fault, PaymentProvider
from tests.support import REPO
from tests.support.actions import (
    event_types,
    in_tx,
    kill_once_the_provider_committed,
    sessions_for,
)
from tests.support.kafka import wait_for

T = "acme"
LEASE_S = 1.5


async def test_worker_killed_after_the_refund_is_unknown_then_reconciled(db_url: str) -> None:
    store = ActionStore()
    ticket = Ticket(ticket_id="T-cli", charge_id="ch_9", amount_cents=1999)
    with PaymentProvider() as provider:
        hold = provider.inject(Fault.HOLD_AFTER_COMMIT)
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "examples.refund_agent",
                "--db-url",
                db_url,
                "refund",
                "--provider-url",
                provider.url,
                "--tenant",
                T,
                "--run-id",
                "run-7",
                "--charge-id",
                ticket.charge_id,
                "--amount",
                str(ticket.amount_cents),
                "--timeout",
                "60",
                "--lease",
                str(LEASE_S),
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        await kill_once_the_provider_committed(
            worker, hold, "the worker's refund to be committed at the provider"
        )
        assert provider.refund_count() == 1

        async with sessions_for(db_url) as sessions:
            payments = PaymentsClient(provider.url, account=T, timeout_s=30)
            agent = refund_agent(payments)
            run = AgentRun(sessions, tenant=T, run_id="run-7", store=store)
            key = agent.tool_key(run, "refund", ticket.tool_arguments())
            crashed = await in_tx(sessions, lambda s: store.get(s, T, key))
            assert crashed.state is State.RUNNING  # nobody recorded the outcome
            assert f":{worker.pid}:" in crashed.lease_holder

            # lease expiry (database clock) turns it UNKNOWN, never PENDING
            swept = await wait_for(
                lambda: in_tx(sessions, lambda s: store.sweep_expired_leases(s)),
                lambda found: len(found) == 1,
                30,
                "the worker's lease to expire",
            )
            assert swept[0].state is State.UNKNOWN

            [reconciled] = await reconcile_unknown(sessions, store, payments.reconcile)
            assert reconciled.state is State.SUCCEEDED
            assert reconciled.result == provider.refunds()[0]

            again = await handle_ticket(run, agent, ticket)  # the agent's run after restart
            assert reconciled.result["id"] in again.output
        assert provider.refund_count() == 1 and provider.replays == 0
    assert event_types(db_url, T, key) == ["requested", "started", "unknown", "reconciled"]
