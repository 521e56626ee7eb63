"""LangGraph on outboxkit's ledger: a node that runs again from its start after an interrupt
does not refund twice; approvals given with ``Command(resume=...)`` are bound to the arguments'
hash (in-process: PostgreSQL and the loopback provider counting refunds)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command
from outboxkit.agents import AgentRun, json_hash
from outboxkit.agents.langgraph import ledger_task
from outboxkit.agents.ledger import current_call, using_run
from sqlalchemy.engine import make_url

from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import PaymentProvider
from tests.agents.test_pydantic_ai import CALL, agent_process, clocked, operations
from tests.support.actions import event_types, sessions_for
from tests.support.durable_agent import (
    DAY_S,
    build_langgraph_agent,
    chat_model,
    model_calls,
    refund_ids,
)

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
                else:  # refused and recorded; the graph asks again
                    [again] = (await app.ainvoke(resume, config))["__interrupt__"]
                    assert "other arguments" in again.value["refused"]
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


LANGGRAPH = ["--framework", "langgraph-agent"]
CH_2 = {"charge_id": "ch_2", "amount_cents": 700}


@contextlib.asynccontextmanager
async def saved_graph(
    pg_url: str, graph: StateGraph[MessagesState]
) -> AsyncIterator[CompiledStateGraph[MessagesState]]:
    """``graph`` compiled with LangGraph's PostgreSQL saver in the test's database."""
    conn = make_url(pg_url).set(drivername="postgresql").render_as_string(False)
    async with AsyncPostgresSaver.from_conn_string(conn) as saver:
        await saver.setup()
        yield graph.compile(checkpointer=saver)


def thread(run_id: str) -> Any:
    return {"configurable": {"thread_id": run_id}}


async def test_an_agent_killed_after_the_model_answered_does_not_ask_it_again(
    pg_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "model.log"
    with PaymentProvider() as provider:
        argv = [*LANGGRAPH, "--provider-url", provider.url, "--model-log", str(log)]
        argv += ["--call", json.dumps(CALL)]
        code, _ = await agent_process(pg_url, "run", "g-model", *argv, kill_at="before_tool")
        assert code == -9 and model_calls(log) == 1 and provider.refund_count() == 0

        code, out = await agent_process(pg_url, "run", "g-model", *argv)
        assert out is not None and out["status"] == "finished" and len(out["output"]) == 1
        assert model_calls(log) == 2  # the checkpointed answer was not asked for again
        assert provider.refund_count() == 1
        [(key, _)] = operations(pg_url, "agent.tool.refund")
    assert event_types(pg_url, T, key) == [
        "requested",
        "started",
        "unknown",
        "reconciled",
        "started",
        "succeeded",
    ]


async def test_the_same_tool_call_twice_in_a_run_is_one_refund(pg_url: str, tmp_path: Path) -> None:
    log = tmp_path / "model.log"
    with PaymentProvider() as provider:
        payments = PaymentsClient(provider.url, account=T)
        graph = build_langgraph_agent(payments, chat_model([CALL, CALL], log))
        async with sessions_for(pg_url) as sessions, saved_graph(pg_url, graph) as app:
            with using_run(AgentRun(sessions, tenant=T, run_id="g-twice")):
                done = await app.ainvoke({"messages": [HumanMessage("refund")]}, thread("g-twice"))
        assert len(refund_ids(done["messages"])) == 1 and model_calls(log) == 3
        assert provider.refund_count() == 1
    assert len(operations(pg_url, "agent.tool.refund")) == 1


async def test_an_approval_for_other_arguments_or_expired_is_refused_and_the_right_one_days_later_elsewhere_refunds_once(  # noqa: E501
    pg_url: str,
) -> None:
    with PaymentProvider() as provider:
        argv = [*LANGGRAPH, "--provider-url", provider.url, "--approval"]
        argv += ["--call", json.dumps(CALL)]
        _, out = await agent_process(pg_url, "run", "g-appr", *argv)
        assert out is not None and out["status"] == "waiting"  # the process exited
        [pending] = out["approvals"]
        assert pending["args"] == CALL and pending["args_hash"] == json_hash(CALL)

        payments = PaymentsClient(provider.url, account=T)
        graph = build_langgraph_agent(payments, chat_model([CALL], None), approval=True)
        async with sessions_for(pg_url) as sessions, saved_graph(pg_url, graph) as app:
            other = Command(resume={"args_hash": json_hash({**CALL, "x": 1}), "by": "mallory"})
            with using_run(clocked(sessions, "g-appr", 0)):
                [again] = (await app.ainvoke(other, thread("g-appr")))["__interrupt__"]
            assert "other arguments" in again.value["refused"]  # recorded; asked again

            with using_run(clocked(sessions, "g-exp", 0)):  # another thread, approved too late
                start = {"messages": [HumanMessage("refund")]}
                [asked] = (await app.ainvoke(start, thread("g-exp")))["__interrupt__"]
            late = Command(resume={"args_hash": asked.value["args_hash"], "by": "alice"})
            with using_run(clocked(sessions, "g-exp", 4 * DAY_S)):
                [again] = (await app.ainvoke(late, thread("g-exp")))["__interrupt__"]
            assert "expired" in again.value["refused"]
        assert provider.refund_count() == 0
        assert len(operations(pg_url, "agent.approval.refused")) == 2

        two_days = ["--clock-offset-s", str(2 * DAY_S)]
        resume = ["--resume", json.dumps({"args_hash": pending["args_hash"], "by": "alice"})]
        _, done = await agent_process(pg_url, "run", "g-appr", *argv, *two_days, *resume)
        assert done is not None and done["status"] == "finished" and len(done["output"]) == 1
        assert provider.refund_count() == 1
    [(key, _)] = operations(pg_url, "agent.tool.refund")
    assert event_types(pg_url, T, key) == ["requested", "started", "succeeded"]


async def test_a_redeploy_between_steps_resumes_in_a_new_process(
    pg_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "model.log"
    with PaymentProvider() as provider:
        argv = [*LANGGRAPH, "--provider-url", provider.url, "--model-log", str(log)]
        argv += ["--call", json.dumps(CALL), "--call", json.dumps(CH_2)]
        _, out = await agent_process(pg_url, "run", "g-deploy", *argv, "--steps", "2")
        assert out == {"status": "stopped", "steps": 2}  # the model, then the first refund
        assert model_calls(log) == 1 and provider.refund_count() == 1

        _, out = await agent_process(pg_url, "run", "g-deploy", *argv)  # the new deployment
        assert out is not None and out["status"] == "finished" and len(out["output"]) == 2
        assert model_calls(log) == 3 and provider.refund_count() == 2
