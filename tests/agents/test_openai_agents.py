"""The OpenAI Agents SDK on outboxkit's ledger: a scripted model (its ``Model`` interface), a
provider on loopback counting refunds, PostgreSQL, real processes SIGKILLed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from outboxkit.agents import (
    AgentRun,
    ApprovalRefusedError,
    DefinitionChangedError,
    decide,
    json_hash,
)
from outboxkit.agents.openai_agents import RunFinished, RunWaiting

from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import PaymentProvider
from tests.agents.test_pydantic_ai import CALL, T, agent_process, clocked, operations
from tests.support.actions import event_types, sessions_for
from tests.support.durable_agent import DAY_S, INSTRUCTIONS, build_openai, model_calls

pytestmark = pytest.mark.timeout(1800)  # processes importing the frameworks: 40-150 s each
OPENAI = ["--framework", "openai"]


async def test_killed_after_the_provider_committed_resumes_with_one_refund(
    pg_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "model.log"
    with PaymentProvider() as provider:
        common = [*OPENAI, "--provider-url", provider.url, "--model-log", str(log)]
        common += ["--call", json.dumps(CALL), "--call", json.dumps(CALL)]  # the same call twice
        code, _ = await agent_process(pg_url, "run", "o-commit", *common, kill_at="after_provider")
        assert code == -9 and provider.refund_count() == 1
        [(key, state)] = operations(pg_url, "agent.tool.refund")
        assert state == "RUNNING"

        code, out = await agent_process(pg_url, "run", "o-commit", *common)
        assert out == {"status": "finished", "output": "done: 1 distinct results"}
        assert provider.refund_count() == 1 and provider.replays == 0
        assert model_calls(log) == 3  # request 0 replayed on resume: 3 requests, 3 calls
    assert event_types(pg_url, T, key) == ["requested", "started", "unknown", "reconciled"]


async def test_killed_after_the_model_answered_does_not_ask_the_model_again(
    pg_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "model.log"
    with PaymentProvider() as provider:
        common = [*OPENAI, "--provider-url", provider.url, "--model-log", str(log)]
        common += ["--call", json.dumps(CALL)]
        code, _ = await agent_process(pg_url, "run", "o-model", *common, kill_at="before_tool")
        assert code == -9 and model_calls(log) == 1 and provider.refund_count() == 0

        code, out = await agent_process(pg_url, "run", "o-model", *common)
        assert out == {"status": "finished", "output": "done: 1 distinct results"}
        assert model_calls(log) == 2  # the recorded tool call was replayed, not asked again
        assert provider.refund_count() == 1
    assert len(operations(pg_url, "agent.model_request")) == 2


async def test_the_same_call_twice_is_one_refund_and_a_replay_asks_no_model(pg_url: str) -> None:
    with PaymentProvider() as provider:
        async with sessions_for(pg_url) as sessions:
            payments = PaymentsClient(provider.url, account=T)
            run = AgentRun(sessions, tenant=T, run_id="o-twice")
            runner = build_openai(payments, calls=[CALL, CALL], log=None)
            first = await runner.run(run, "refund")
            assert first == RunFinished("done: 1 distinct results") and runner.model_calls == 3
            again = build_openai(payments, calls=[CALL, CALL], log=None)
            assert await again.run(run, "refund") == first and again.model_calls == 0
        assert provider.refund_count() == 1


async def test_an_approval_after_its_expiry_is_refused_and_makes_no_refund(pg_url: str) -> None:
    with PaymentProvider() as provider:
        async with sessions_for(pg_url) as sessions:
            payments = PaymentsClient(provider.url, account=T)
            runner = build_openai(payments, approval=True, calls=[CALL], log=None)
            waiting = await runner.run(clocked(sessions, "o-exp", 0), "refund")
            assert isinstance(waiting, RunWaiting)
            [pending] = waiting.approvals
            with pytest.raises(ApprovalRefusedError, match="expired"):  # decided too late
                await decide(clocked(sessions, "o-exp", 4 * DAY_S), pending.tool_call_id,
                             args_hash=pending.args_hash, by="alice")  # fmt: skip
            await decide(clocked(sessions, "o-exp", DAY_S), pending.tool_call_id,
                         args_hash=pending.args_hash, by="alice")  # fmt: skip
            with pytest.raises(ApprovalRefusedError, match="expired before the call"):
                await runner.run(clocked(sessions, "o-exp", 4 * DAY_S), "refund")  # ran too late
        assert provider.refund_count() == 0
    assert len(operations(pg_url, "agent.approval.refused")) == 2
    assert operations(pg_url, "agent.tool.refund") == []


@pytest.mark.parametrize("change", ["instructions", "version", "prompt"])
async def test_a_changed_definition_is_caught_on_resume(pg_url: str, change: str) -> None:
    with PaymentProvider() as provider:
        async with sessions_for(pg_url) as sessions:
            payments = PaymentsClient(provider.url, account=T)
            run = AgentRun(sessions, tenant=T, run_id="o-def")
            await build_openai(payments, calls=[CALL], log=None).run(run, "refund")
            changed = build_openai(
                payments,
                calls=[CALL],
                log=None,
                instructions="Refund twice." if change == "instructions" else INSTRUCTIONS,
                version=2 if change == "version" else 1,
            )
            with pytest.raises(DefinitionChangedError):
                await changed.run(run, "refund now" if change == "prompt" else "refund")
            assert changed.model_calls == 0
        assert provider.refund_count() == 1


async def test_an_approval_for_other_arguments_is_refused_and_the_right_one_days_later_resumes_elsewhere(  # noqa: E501
    pg_url: str,
) -> None:
    with PaymentProvider() as provider:
        async with sessions_for(pg_url) as sessions:
            payments = PaymentsClient(provider.url, account=T)
            runner = build_openai(payments, approval=True, calls=[CALL], log=None)
            run = AgentRun(sessions, tenant=T, run_id="o-appr")
            waiting = await runner.run(run, "refund my charges")
            assert isinstance(waiting, RunWaiting)
            [pending] = waiting.approvals
            assert pending.args == CALL
            other = json_hash({**CALL, "amount_cents": 9999})
            with pytest.raises(ApprovalRefusedError, match="other arguments"):
                await decide(run, pending.tool_call_id, args_hash=other, by="mallory")
            assert isinstance(await runner.run(run, "refund my charges"), RunWaiting)
            assert provider.refund_count() == 0
            two_days_later = clocked(sessions, "o-appr", 2 * DAY_S)
            await decide(two_days_later, pending.tool_call_id, args_hash=pending.args_hash, by="a")

        # another process, two days on, resumes the stored RunState: the approved refund once
        argv = [*OPENAI, "--provider-url", provider.url, "--approval", "--call", json.dumps(CALL)]
        argv += ["--clock-offset-s", str(2 * DAY_S)]
        _, out = await agent_process(pg_url, "run", "o-appr", *argv)
        assert out == {"status": "finished", "output": "done: 1 distinct results"}
        assert provider.refund_count() == 1
    assert len(operations(pg_url, "agent.approval.refused")) == 1
    assert len(operations(pg_url, "agent.run.state")) == 1
