"""LangGraph on outboxkit's ledger: a node that runs again from its start after an interrupt
does not refund twice; approvals given with ``Command(resume=...)`` are bound to the arguments'
hash (in-process: PostgreSQL and the loopback provider counting refunds)."""

from __future__ import annotations

import json
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from outboxkit.agents import AgentRun, ApprovalRefusedError, json_hash
from outboxkit.agents.langgraph import ledger_task
from outboxkit.agents.ledger import current_call, using_run

from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import PaymentProvider
from tests.agents.test_pydantic_ai import CALL, agent_process, operations
from tests.support.actions import event_types, sessions_for

T = "acme"
pytestmark = pytest.mark.timeout(1800)  # processes importing the frameworks: 40-150 s each
BIG = {"charge_id": "ch_big", "amount_cents": 40000}


class Ticket(TypedDict, total=False):
    refunds: list[str]


def graph(payments: PaymentsClient, runs: list[str]) -> Any:
    async def refund(charge_id: str, amount_cents: int) -> dict[str, Any]:
        return await payments.refund(
            current_call().idempotency_key,
            charge_id=charge_id,
            amount_cents=amount_cents,
            currency="EUR",
        )

    small = ledger_task(refund, name="refund", target=("charge_id",), reconciler=payments.reconcile)
    big = ledger_task(refund, name="big_refund", target=("charge_id",), needs_approval=True)

    async def node(state: Ticket) -> Ticket:
        runs.append("node")  # LangGraph runs it again from here on resume
        first = await small(charge_id="ch_small", amount_cents=500)
        second = await big(**BIG)
        return {"refunds": [first["id"], second["id"]]}

    builder = StateGraph(Ticket)
    builder.add_node("refunds", node)
    builder.add_edge(START, "refunds")
    builder.add_edge("refunds", END)
    return builder.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize("right", [True, False])
async def test_a_node_run_again_after_its_interrupt_refunds_once(pg_url: str, right: bool) -> None:
    with PaymentProvider() as provider:
        async with sessions_for(pg_url) as sessions:
            runs: list[str] = []
            app = graph(PaymentsClient(provider.url, account=T), runs)
            config = {"configurable": {"thread_id": "thread-1"}}
            with using_run(AgentRun(sessions, tenant=T, run_id="thread-1")):
                first = await app.ainvoke({}, config)
                [pending] = first["__interrupt__"]
                assert pending.value["args"] == BIG and provider.refund_count() == 1
                shown = pending.value["args_hash"] if right else json_hash({**BIG, "x": 1})
                resume = Command(resume={"args_hash": shown, "by": "alice"})
                if right:
                    done = await app.ainvoke(resume, config)
                    assert len(done["refunds"]) == 2 and provider.refund_count() == 2
                else:
                    with pytest.raises(ApprovalRefusedError, match="other arguments"):
                        await app.ainvoke(resume, config)
                    assert provider.refund_count() == 1  # the big refund did not happen
        assert runs == ["node", "node"]  # the node ran again; the small refund did not


async def test_killed_after_the_provider_committed_resumes_with_one_refund(pg_url: str) -> None:
    with PaymentProvider() as provider:
        argv = ["--framework", "langgraph", "--provider-url", provider.url]
        argv += ["--call", json.dumps(CALL), "--call", json.dumps(CALL)]  # the same call twice
        code, _ = await agent_process(pg_url, "run", "g-commit", *argv, kill_at="after_provider")
        assert code == -9 and provider.refund_count() == 1
        [(key, state)] = operations(pg_url, "agent.tool.refund")
        assert state == "RUNNING"
        _, out = await agent_process(pg_url, "run", "g-commit", *argv)
        assert out is not None and out["status"] == "finished" and len(out["output"]) == 1
        assert provider.refund_count() == 1 and provider.replays == 0
    assert event_types(pg_url, T, key) == ["requested", "started", "unknown", "reconciled"]
