"""pydantic-ai on outboxkit's durability: real processes SIGKILLed, a real provider counting
its refunds over loopback HTTP, PostgreSQL, and the events read back from Kafka."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from outboxkit.actions import OperationConflictError
from outboxkit.actions.tables import agent_operations
from outboxkit.agents import (
    AgentRun,
    ApprovalRefusedError,
    DefinitionChangedError,
    decide,
    json_hash,
)
from outboxkit.agents.pydantic_ai import RunFinished, RunWaiting
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay, RelayOptions
from sqlalchemy import select

from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import PaymentProvider
from tests.support import REPO
from tests.support.actions import event_types, sessions_for
from tests.support.durable_agent import DAY_S, INSTRUCTIONS, build, model_calls, scripted
from tests.support.kafka import read_topic

T = "acme"
pytestmark = pytest.mark.timeout(1800)  # processes importing the frameworks: 40-150 s each
CALL = {"charge_id": "ch_1", "amount_cents": 1999}
FAST = RelayOptions(lease_ttl_s=5.0, request_timeout_s=2.0, poll_interval_s=0.2)


async def agent_process(
    db_url: str, command: str, run_id: str, *extra: str, kill_at: str | None = None
) -> tuple[int, dict[str, Any] | None]:
    """Run the agent process to its end; its exit code and its JSON line (None if killed)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OUTBOXKIT_TEST_KILL_AT", None)
    if kill_at:
        env["OUTBOXKIT_TEST_KILL_AT"] = kill_at
    argv = [sys.executable, "-m", "tests.support.durable_agent", command, "--db-url", db_url]
    result = await asyncio.to_thread(
        subprocess.run,
        [*argv, "--run-id", run_id, *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # a loaded machine: importing the frameworks alone took 40 s
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode == 0:
        assert lines, result.stdout + result.stderr
    return result.returncode, json.loads(lines[-1]) if lines else None


def operations(db_url: str, action_type: str) -> list[tuple[str, str]]:
    """``(key, state)`` of the ledger's operations of ``action_type``."""
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(agent_operations.c.op_key, agent_operations.c.state).where(
                    agent_operations.c.action_type == action_type
                )
            ).all()
    finally:
        engine.dispose()
    return [(r[0], r[1]) for r in rows]


async def published(pg_url: str, kafka_bootstrap: str, topic: str) -> list[str]:
    """Relay the outbox to Kafka and return the event types read back from ``topic``."""
    relay = Relay(db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=FAST)
    sent = await relay.drain(timeout_s=60)
    records = await read_topic(kafka_bootstrap, topic, expected=sent)
    return [dict(r.headers)["ce_type"].decode() for r in records]


async def test_killed_after_the_provider_committed_resumes_with_one_refund(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    log = tmp_path / "model.log"
    with PaymentProvider() as provider:
        common = ["--provider-url", provider.url, "--topic", topic, "--model-log", str(log)]
        common += ["--call", json.dumps(CALL)]
        code, _ = await agent_process(pg_url, "run", "r-commit", *common, kill_at="after_provider")
        assert code == -9 and provider.refund_count() == 1
        [(key, state)] = operations(pg_url, "agent.tool.refund")
        assert state == "RUNNING"  # the refund landed; nobody recorded it

        code, out = await agent_process(pg_url, "run", "r-commit", *common)
        assert code == 0 and out == {"status": "finished", "output": "done: 1 distinct results"}
        assert provider.refund_count() == 1 and provider.replays == 0
        assert model_calls(log) == 2  # the tool call once, the final answer once
    assert event_types(pg_url, T, key) == ["requested", "started", "unknown", "reconciled"]
    types = await published(pg_url, kafka_bootstrap, topic)
    assert types.count("outboxkit.action.reconciled") == 1
    assert types.count("outboxkit.action.succeeded") == 4  # start, 2 model answers, outcome


async def test_killed_after_the_model_answered_does_not_ask_the_model_again(
    pg_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "model.log"
    with PaymentProvider() as provider:
        common = ["--provider-url", provider.url, "--model-log", str(log)]
        common += ["--call", json.dumps(CALL)]
        code, _ = await agent_process(pg_url, "run", "r-model", *common, kill_at="before_tool")
        assert code == -9 and model_calls(log) == 1 and provider.refund_count() == 0

        code, out = await agent_process(pg_url, "run", "r-model", *common)
        assert code == 0 and out is not None and out["status"] == "finished"
        assert model_calls(log) == 2  # the recorded tool call was replayed, not asked again
        assert provider.refund_count() == 1
        [(key, _)] = operations(pg_url, "agent.tool.refund")
    # the killed claim became UNKNOWN, the provider proved it absent, then it ran once
    assert event_types(pg_url, T, key) == [
        "requested",
        "started",
        "unknown",
        "reconciled",
        "started",
        "succeeded",
    ]


def clocked(sessions: Any, run_id: str, offset_s: float) -> AgentRun:
    """The run, on a clock ``offset_s`` ahead (the simulated days of waiting)."""
    return AgentRun(sessions, tenant=T, run_id=run_id, clock=lambda: time.time() + offset_s)


async def test_an_approval_for_other_arguments_or_expired_is_refused_and_the_right_one_days_later_runs_once(  # noqa: E501
    pg_url: str,
) -> None:
    with PaymentProvider() as provider:
        run = ["--provider-url", provider.url, "--approval", "--call", json.dumps(CALL)]
        code, out = await agent_process(pg_url, "run", "r-appr", *run)
        assert code == 0 and out is not None and out["status"] == "waiting"  # the process exited
        [pending] = out["approvals"]
        assert pending["args"] == CALL and pending["hash"] == json_hash(CALL)

        async with sessions_for(pg_url) as sessions:  # the approver's process: this one
            now = clocked(sessions, "r-appr", 0)
            other = json_hash({**CALL, "amount_cents": 9999})
            with pytest.raises(ApprovalRefusedError, match="other arguments"):
                await decide(now, "call-0", args_hash=other, by="mallory")
            with pytest.raises(ApprovalRefusedError, match="expired"):
                await decide(clocked(sessions, "r-appr", 4 * DAY_S), "call-0",
                             args_hash=pending["hash"], by="alice")  # fmt: skip
            assert len(operations(pg_url, "agent.approval.refused")) == 2
            durable = build(PaymentsClient(provider.url, account=T), approval=True, version=2)
            with pytest.raises(DefinitionChangedError):  # a redeploy with another definition
                await durable.run(now, "refund my charges", model=scripted([CALL], None))
            two_days_later = clocked(sessions, "r-appr", 2 * DAY_S)
            decision = await decide(two_days_later, "call-0", args_hash=pending["hash"], by="a")
            assert decision.approved and provider.refund_count() == 0

        two_days = ["--clock-offset-s", str(2 * DAY_S)]
        code, done = await agent_process(pg_url, "run", "r-appr", *run, *two_days)
        assert done == {"status": "finished", "output": "done: 1 distinct results"}
        assert provider.refund_count() == 1
    [(key, _)] = operations(pg_url, "agent.tool.refund")
    assert event_types(pg_url, T, key) == ["requested", "started", "succeeded"]


async def test_an_approval_expired_when_the_tool_runs_is_refused(pg_url: str) -> None:
    with PaymentProvider() as provider:
        async with sessions_for(pg_url) as sessions:
            durable = build(PaymentsClient(provider.url, account=T), approval=True)
            waiting = await durable.run(
                clocked(sessions, "r-exp", 0), "refund", model=scripted([CALL], None)
            )
            assert isinstance(waiting, RunWaiting)
            [pending] = waiting.approvals
            await decide(
                clocked(sessions, "r-exp", DAY_S), "call-0", args_hash=pending.args_hash, by="a"
            )
            with pytest.raises(ApprovalRefusedError, match="expired"):
                await durable.run(
                    clocked(sessions, "r-exp", 4 * DAY_S), "refund", model=scripted([CALL], None)
                )
        assert provider.refund_count() == 0
        assert len(operations(pg_url, "agent.approval.refused")) == 1


async def test_the_same_call_twice_is_one_refund_and_a_replay_asks_no_model(pg_url: str) -> None:
    with PaymentProvider() as provider:
        async with sessions_for(pg_url) as sessions:
            durable = build(PaymentsClient(provider.url, account=T))
            run = AgentRun(sessions, tenant=T, run_id="r-twice")
            first = await durable.run(run, "refund", model=scripted([CALL, CALL], None))
            assert isinstance(first, RunFinished) and first.model_calls == 3
            replay = await durable.run(run, "refund", model=scripted([CALL, CALL], None))
            assert isinstance(replay, RunFinished) and replay.model_calls == 0
            assert replay.output == first.output == "done: 1 distinct results"
        assert provider.refund_count() == 1


async def test_other_arguments_for_the_same_charge_are_the_ledgers_conflict(pg_url: str) -> None:
    with PaymentProvider() as provider:
        async with sessions_for(pg_url) as sessions:
            durable = build(PaymentsClient(provider.url, account=T))
            run = AgentRun(sessions, tenant=T, run_id="r-conflict")
            model = scripted([CALL, {**CALL, "amount_cents": 5}], None)
            with pytest.raises(OperationConflictError):
                await durable.run(run, "refund", model=model)
        assert provider.refund_count() == 1


@pytest.mark.parametrize("change", ["instructions", "version", "prompt"])
async def test_a_changed_definition_is_caught_on_resume(pg_url: str, change: str) -> None:
    with PaymentProvider() as provider:
        async with sessions_for(pg_url) as sessions:
            payments = PaymentsClient(provider.url, account=T)
            run = AgentRun(sessions, tenant=T, run_id="r-def")
            await build(payments).run(run, "refund", model=scripted([CALL], None))
            changed = build(
                payments,
                instructions="Refund twice." if change == "instructions" else INSTRUCTIONS,
                version=2 if change == "version" else 1,
            )
            prompt = "refund now" if change == "prompt" else "refund"
            with pytest.raises(DefinitionChangedError):
                await changed.run(run, prompt, model=scripted([CALL], None))
        assert provider.refund_count() == 1
