"""The OpenAI Agents SDK on outboxkit's ledger: a scripted model (its ``Model`` interface), a
provider on loopback counting refunds, PostgreSQL, real processes SIGKILLed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from outboxkit.agents import AgentRun, ApprovalRefusedError, decide, json_hash
from outboxkit.agents.openai_agents import RunWaiting

from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import PaymentProvider
from tests.agents.test_pydantic_ai import CALL, T, agent_process, operations
from tests.support.actions import event_types, sessions_for
from tests.support.durable_agent import build_openai, model_calls

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
        assert model_calls(log) == 4  # this SDK's model is not recorded: asked again on resume
    assert event_types(pg_url, T, key) == ["requested", "started", "unknown", "reconciled"]


async def test_an_approval_for_other_arguments_is_refused_and_the_right_one_resumes_elsewhere(
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
            await decide(run, pending.tool_call_id, args_hash=pending.args_hash, by="alice")

        # another process resumes the stored RunState and runs the approved refund once
        argv = [*OPENAI, "--provider-url", provider.url, "--approval", "--call", json.dumps(CALL)]
        _, out = await agent_process(pg_url, "run", "o-appr", *argv)
        assert out == {"status": "finished", "output": "done: 1 distinct results"}
        assert provider.refund_count() == 1
    assert len(operations(pg_url, "agent.approval.refused")) == 1
    assert len(operations(pg_url, "agent.run.state")) == 1
