"""A pydantic-ai refund agent on outboxkit's durability, as a process the crash tests kill.

``python -m tests.support.durable_agent run ...`` runs (or resumes) one run and prints one JSON
line; ``decide ...`` records an approval decision from another process. The scripted model
appends one line to ``--model-log`` per request it answers, so a test counts model calls
across processes; ``OUTBOXKIT_TEST_KILL_AT`` SIGKILLs the process at a named point of the tool:
``before_tool`` (the model's answer is recorded, the tool has not run) or ``after_provider``
(the provider committed the refund, the ledger has not recorded it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents import Agent as OpenAIAgent
from agents import set_tracing_disabled
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command
from outboxkit.actions import ActionStore
from outboxkit.agents import AgentRun, AgentRunError, ApprovalRefusedError, current_call, decide
from outboxkit.agents.langgraph import ledger_task
from outboxkit.agents.ledger import RUN_RECORDS_TTL_S, using_run
from outboxkit.agents.openai_agents import DurableRunner, ledger_tool
from outboxkit.agents.openai_agents import RunFinished as OpenAIFinished
from outboxkit.agents.pydantic_ai import DurableAgent, DurableTool, RunFinished
from outboxkit.outbox import Outbox
from outboxkit.outbox.db import make_async_engine
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, Tool
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import async_sessionmaker

from examples.refund_agent.agent import tool_returns
from examples.refund_agent.payments import PaymentsClient
from tests.support.openai_model import ScriptedModel

DAY_S = 86400.0
set_tracing_disabled(True)  # offline: no trace exporter thread waiting for an API key at exit
INSTRUCTIONS = "Refund what the ticket asks for with the refund tool."


def kill_at(point: str) -> None:
    """SIGKILL this process if ``OUTBOXKIT_TEST_KILL_AT`` names ``point``."""
    if os.environ.get("OUTBOXKIT_TEST_KILL_AT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def build(
    payments: PaymentsClient,
    *,
    approval: bool = False,
    instructions: str = INSTRUCTIONS,
    version: int = 1,
    approval_ttl_s: float = 3 * DAY_S,
) -> DurableAgent[None, Any]:
    """The durable refund agent: one tool, ``refund``, keyed by charge, reconciled by key."""

    async def refund(charge_id: str, amount_cents: int, currency: str = "EUR") -> dict[str, Any]:
        """Refund ``amount_cents`` of charge ``charge_id``."""
        kill_at("before_tool")
        reply = await payments.refund(
            current_call().idempotency_key,
            charge_id=charge_id,
            amount_cents=amount_cents,
            currency=currency,
        )
        kill_at("after_provider")
        return reply

    output: Any = [str, DeferredToolRequests] if approval else str
    agent = Agent(
        name="refund-agent",
        instructions=instructions,
        tools=[Tool(refund, requires_approval=approval)],
        output_type=output,
    )
    return DurableAgent(
        agent,
        version=version,
        tools={"refund": DurableTool(target=("charge_id",), reconciler=payments.reconcile)},
        approval_ttl_s=approval_ttl_s,
    )


def build_openai(
    payments: PaymentsClient,
    *,
    approval: bool = False,
    calls: list[dict[str, Any]],
    log: Path | None,
    instructions: str = INSTRUCTIONS,
    version: int = 1,
) -> DurableRunner:
    """The same refund agent on the OpenAI Agents SDK, with a scripted model."""

    async def refund(charge_id: str, amount_cents: int, currency: str = "EUR") -> dict[str, Any]:
        """Refund ``amount_cents`` of charge ``charge_id``."""
        kill_at("before_tool")
        reply = await payments.refund(
            current_call().idempotency_key,
            charge_id=charge_id,
            amount_cents=amount_cents,
            currency=currency,
        )
        kill_at("after_provider")
        return reply

    tool = ledger_tool(
        refund, target=("charge_id",), reconciler=payments.reconcile, needs_approval=approval
    )
    model = ScriptedModel("refund", calls, log)
    agent = OpenAIAgent(name="refund-agent", instructions=instructions, tools=[tool], model=model)
    return DurableRunner(agent, version=version, approval_ttl_s=3 * DAY_S)


def killable_refund(payments: PaymentsClient) -> Callable[..., Awaitable[dict[str, Any]]]:
    """The LangGraph tools' refund at the provider, killed where ``kill_at`` says."""

    async def refund(charge_id: str, amount_cents: int) -> dict[str, Any]:
        kill_at("before_tool")
        reply = await payments.refund(
            current_call().idempotency_key,
            charge_id=charge_id,
            amount_cents=amount_cents,
            currency="EUR",
        )
        kill_at("after_provider")
        return reply

    return refund


def build_langgraph(payments: PaymentsClient, calls: list[dict[str, Any]]) -> Any:
    """A LangGraph graph whose one node makes the refunds of ``calls`` through the ledger."""

    refund = killable_refund(payments)
    task = ledger_task(refund, target=("charge_id",), reconciler=payments.reconcile)

    async def node(state: dict[str, Any]) -> dict[str, Any]:
        made = [await task(**call) for call in calls]
        return {"refunds": sorted({refund["id"] for refund in made})}

    builder = StateGraph(dict)
    builder.add_node("refunds", node)
    builder.add_edge(START, "refunds")
    builder.add_edge("refunds", END)
    return builder.compile()


class ScriptedChatModel(FakeMessagesListChatModel):
    """langchain-core's fake chat model, answering by the conversation (not by its own count,
    which a new process starts again): the ``n``-th answer for ``n`` answers before it. Each
    request appends a line to ``log``."""

    log: str | None = None

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        if self.log:
            with Path(self.log).open("a") as out:
                out.write("call\n")
        self.i = sum(isinstance(m, AIMessage) for m in messages)
        return super()._generate(messages, *args, **kwargs)


def chat_model(calls: list[dict[str, Any]], log: Path | None) -> ScriptedChatModel:
    """Tool calls of ``refund`` with ``calls``, one per turn, then a text."""
    turns: list[BaseMessage] = [
        AIMessage("", tool_calls=[{"name": "refund", "args": call, "id": f"call-{n}"}])
        for n, call in enumerate(calls)
    ]
    return ScriptedChatModel(responses=[*turns, AIMessage("done")], log=str(log) if log else None)


def build_langgraph_agent(
    payments: PaymentsClient, model: ScriptedChatModel, *, approval: bool = False
) -> StateGraph[MessagesState]:
    """A LangGraph agent: a model node and a tools node whose refund goes through the ledger."""

    refund = killable_refund(payments)
    task = ledger_task(
        refund,
        target=("charge_id",),
        reconciler=payments.reconcile,
        needs_approval=approval,
        approval_ttl_s=3 * DAY_S,
    )

    async def ask_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async def run_tools(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        results = [(call["id"], await task(**call["args"])) for call in last.tool_calls]
        return {"messages": [ToolMessage(json.dumps(r), tool_call_id=i) for i, r in results]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("model", ask_model)
    graph.add_node("tools", run_tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph


def refund_ids(messages: list[BaseMessage]) -> list[str]:
    """The distinct refund ids the tools returned in a LangGraph conversation."""
    return sorted(
        {json.loads(str(m.content))["id"] for m in messages if isinstance(m, ToolMessage)}
    )


async def run_langgraph(
    run: AgentRun, payments: PaymentsClient, args: argparse.Namespace
) -> dict[str, Any]:
    """Start, resume (after a crash or a redeploy) or answer the interrupt of thread ``run_id``;
    its checkpoints in PostgreSQL (LangGraph's own saver), its effects in the ledger."""
    calls = [json.loads(c) for c in args.call]
    model = chat_model(calls, Path(args.model_log) if args.model_log else None)
    conn = make_url(args.db_url).set(drivername="postgresql").render_as_string(False)
    async with AsyncPostgresSaver.from_conn_string(conn) as saver:
        await saver.setup()
        graph = build_langgraph_agent(payments, model, approval=args.approval)
        app = graph.compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": run.run_id}}
        snapshot = await app.aget_state(config)
        start: Any = {"messages": [HumanMessage("refund my charges")]}
        if args.resume:
            start = Command(resume=json.loads(args.resume))
        elif snapshot.next:
            start = None  # a crash or a redeploy between steps: go on from the checkpoint
        steps = 0
        with using_run(run):
            async for _ in app.astream(start, config):
                steps += 1
                if steps == args.steps:
                    return {"status": "stopped", "steps": steps}
        state = await app.aget_state(config)
    if state.interrupts:
        return {"status": "waiting", "approvals": [i.value for i in state.interrupts]}
    return {"status": "finished", "output": refund_ids(state.values["messages"])}


def scripted(calls: list[dict[str, Any]], log: Path | None) -> FunctionModel:
    """A model that makes the tool calls in ``calls`` one per turn, then answers."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if log is not None:
            with log.open("a") as out:
                out.write("call\n")
        done = sum(isinstance(m, ModelResponse) for m in messages)
        if done < len(calls):
            return ModelResponse(
                parts=[ToolCallPart("refund", calls[done], tool_call_id=f"call-{done}")]
            )
        ids = sorted({str(p.content)[:200] for p in tool_returns(messages)})
        return ModelResponse(parts=[TextPart(f"done: {len(ids)} distinct results")])

    return FunctionModel(respond, model_name="scripted")


def model_calls(log: Path) -> int:
    """How many requests the scripted model answered, in every process."""
    return len(log.read_text().splitlines()) if log.exists() else 0


def agent_run(sessions: Any, args: argparse.Namespace) -> AgentRun:
    """The run of ``args``, its events on ``--topic``, its clock ``--clock-offset-s`` ahead."""
    offset = args.clock_offset_s
    return AgentRun(
        sessions,
        tenant=args.tenant,
        run_id=args.run_id,
        store=ActionStore(Outbox(default_topic=args.topic), ttl_s=RUN_RECORDS_TTL_S),
        clock=lambda: time.time() + offset,
        lease_s=args.lease_s,
        timeout_s=30,
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    engine = make_async_engine(args.db_url)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    run = agent_run(sessions, args)
    try:
        if args.command == "decide":
            try:
                decision = await decide(
                    run, args.tool_call_id, args_hash=args.args_hash, by=args.by
                )
            except ApprovalRefusedError as error:
                return {"status": "refused", "error": str(error)}
            return {"status": "decided", "approved": decision.approved}
        payments = PaymentsClient(args.provider_url, account=args.tenant, timeout_s=30)
        durable = build(
            payments,
            approval=args.approval,
            instructions=args.instructions,
            version=args.version,
            approval_ttl_s=args.approval_ttl_s,
        )
        calls = [json.loads(c) for c in args.call]
        log = Path(args.model_log) if args.model_log else None
        try:
            if args.framework == "langgraph-agent":
                return await run_langgraph(run, payments, args)
            if args.framework == "langgraph":
                with using_run(run):
                    state = await build_langgraph(payments, calls).ainvoke({})
                return {"status": "finished", "output": state["refunds"]}
            if args.framework == "openai":
                runner = build_openai(payments, approval=args.approval, calls=calls, log=log)
                done = await runner.run(run, "refund my charges")
                if isinstance(done, OpenAIFinished):
                    return {"status": "finished", "output": done.output}
                return {"status": "waiting", "approvals": [
                    {"id": a.tool_call_id, "args": a.args, "hash": a.args_hash}
                    for a in done.approvals
                ]}  # fmt: skip
            result = await durable.run(run, "refund my charges", model=scripted(calls, log))
        except AgentRunError as error:
            return {"status": "error", "type": type(error).__name__, "error": str(error)}
        if isinstance(result, RunFinished):
            return {"status": "finished", "output": result.output}
        return {
            "status": "waiting",
            "approvals": [
                {"id": a.tool_call_id, "args": a.args, "hash": a.args_hash, "at": a.expires_at}
                for a in result.approvals
            ],
        }
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.durable_agent")
    parser.add_argument("command", choices=["run", "decide"])
    parser.add_argument("--db-url", required=True)
    parser.add_argument(
        "--framework",
        choices=["pydantic-ai", "openai", "langgraph", "langgraph-agent"],
        default="pydantic-ai",
    )
    parser.add_argument("--topic", default="outboxkit.actions")
    parser.add_argument("--tenant", default="acme")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--clock-offset-s", type=float, default=0.0)
    parser.add_argument("--lease-s", type=float, default=2.0)
    parser.add_argument("--provider-url", default="")
    parser.add_argument("--call", action="append", default=[], help="JSON arguments, per turn")
    parser.add_argument("--model-log", default="")
    parser.add_argument("--approval", action="store_true")
    parser.add_argument("--approval-ttl-s", type=float, default=3 * DAY_S)
    parser.add_argument("--instructions", default=INSTRUCTIONS)
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--tool-call-id", default="call-0")
    parser.add_argument("--args-hash", default="")
    parser.add_argument("--by", default="alice")
    parser.add_argument("--resume", default="", help="LangGraph: Command(resume=<this JSON>)")
    parser.add_argument("--steps", type=int, default=0, help="LangGraph: stop after N steps")
    print(json.dumps(asyncio.run(main_async(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
