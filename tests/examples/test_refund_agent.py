"""The refund agent (pydantic-ai, scripted model, offline) against the loopback provider.

The provider honours Idempotency-Key over real HTTP; the agent's refund tool is a step, so a
crashed run started again and a model repeating its tool call both end in one refund.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from outboxkit.actions import ActionStore, State
from outboxkit.agents import AgentRun
from pydantic_ai.messages import ToolCallPart

from examples.refund_agent.agent import (
    Refund,
    Ticket,
    handle_ticket,
    refund_agent,
    scripted_model,
    tool_returns,
)
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
from tests.support.waits import scaled

T = "acme"
TICKET = Ticket(ticket_id="T-7", charge_id="ch_7", amount_cents=1999)

BODY = {"charge_id": "ch_1", "amount_cents": 500, "currency": "EUR"}


def call(url: str, method: str, path: str, body=None, headers=None):
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=scaled(30))
    try:
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=payload, headers=headers or {})
        response = connection.getresponse()
        names = {name.lower(): value for name, value in response.getheaders()}  # any case
        return response.status, names, json.loads(response.read())
    finally:
        connection.close()


def refund(url: str, key: str, body=BODY, account: str = "acme"):
    return call(url, "POST", "/refunds", body, {"Idempotency-Key": key, "X-Account": account})


def lookup(url: str, key: str, account: str = "acme"):
    return call(url, "GET", f"/refunds?idempotency_key={key}", None, {"X-Account": account})


async def test_provider_replays_refuses_and_scopes_keys_per_account() -> None:
    with PaymentProvider() as provider:
        status, headers, first = refund(provider.url, "k1")
        assert status == 201 and "idempotent-replay" not in headers
        status, headers, replay = refund(provider.url, "k1")
        assert (status, headers.get("idempotent-replay"), replay) == (201, "true", first)
        status, _, _ = refund(provider.url, "k1", {**BODY, "amount_cents": 501})
        assert status == 422
        status, _, other = refund(provider.url, "k1", account="globex")
        assert status == 201 and other["id"] != first["id"]
        status, _, _ = call(provider.url, "POST", "/refunds", BODY, {"X-Account": "acme"})
        assert status == 400  # no Idempotency-Key

        _, _, found = lookup(provider.url, "k1")
        assert found == {"count": 1, "refunds": [first], "in_flight": False}
        assert provider.refund_count() == 2 and provider.replays == 1


async def test_provider_answers_409_while_the_first_request_is_in_flight() -> None:
    with PaymentProvider() as provider:
        hold = provider.inject(Fault.HOLD_BEFORE_COMMIT)
        first = asyncio.create_task(asyncio.to_thread(refund, provider.url, "k1"))
        try:
            await wait_for(hold.reached.is_set, bool, 30, "the first request to be held")
            status, _, _ = await asyncio.to_thread(refund, provider.url, "k1")
            assert status == 409
            _, _, lookup = await asyncio.to_thread(
                call,
                provider.url,
                "GET",
                "/refunds?idempotency_key=k1",
                None,
                {"X-Account": "acme"},
            )
            assert lookup["in_flight"] is True and lookup["count"] == 0
        finally:
            hold.release()
        status, _, _ = await asyncio.wait_for(first, scaled(30))
        assert status == 201 and provider.refund_count() == 1


async def test_the_demo_ends_with_one_refund(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env["OUTBOXKIT_DB_URL"] = f"sqlite:///{tmp_path / 'demo.db'}"
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "examples.refund_agent"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(200),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "provider refunds: 1" in result.stdout
    assert "outboxkit.action.reconciled" in result.stdout


def start_worker(db_url: str, provider_url: str, run_id: str) -> subprocess.Popen[bytes]:
    """The agent on TICKET in its own process, with a short lease (heartbeats extend it)."""
    command = [sys.executable, "-m", "examples.refund_agent", "--db-url", db_url, "refund"]
    command += ["--provider-url", provider_url, "--tenant", T, "--run-id", run_id]
    command += ["--charge-id", TICKET.charge_id, "--amount", str(TICKET.amount_cents)]
    command += ["--timeout", "60", "--lease", "1.5"]
    return subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


async def test_a_run_killed_after_the_refund_starts_again_and_gets_the_stored_refund(
    db_url: str,
) -> None:
    """The scripted model calls the refund tool; the provider refunds; the process dies before
    the outcome is recorded. The run starts again with the same run id: its tool call waits
    out the dead worker's lease, the reconciler finds the refund, and the agent gets it."""
    with PaymentProvider() as provider:
        hold = provider.inject(Fault.HOLD_AFTER_COMMIT)
        worker = start_worker(db_url, provider.url, "run-crash")
        await kill_once_the_provider_committed(
            worker, hold, "the agent's refund to be committed at the provider"
        )
        assert provider.refund_count() == 1

        async with sessions_for(db_url) as sessions:
            agent = refund_agent(PaymentsClient(provider.url, account=T))
            actions = AgentRun(sessions, tenant=T, run_id="run-crash")
            key = agent.tool_key(actions, "refund", TICKET.tool_arguments())
            crashed = await in_tx(sessions, lambda s: ActionStore().get(s, T, key))
            assert crashed.state is State.RUNNING  # nobody recorded the outcome

            # started again on the worker's ticket: the same prompt, or the run is another one
            worker_ticket = Ticket("T-cli", TICKET.charge_id, TICKET.amount_cents)
            result = await handle_ticket(actions, agent, worker_ticket)
        stored = Refund.model_validate(provider.refunds()[0])
        [returned] = tool_returns(result.messages)
        # the model got the refund the reconciler found (the provider's record, as it gives it)
        assert Refund.model_validate(returned.content) == stored
        assert result.output == f"Refunded as {stored.id}."
        assert provider.refund_count() == 1 and provider.replays == 0
    assert event_types(db_url, T, key) == ["requested", "started", "unknown", "reconciled"]


async def test_a_model_repeating_its_tool_call_gets_the_stored_refund(db_url: str) -> None:
    with PaymentProvider() as provider:
        async with sessions_for(db_url) as sessions:
            agent = refund_agent(PaymentsClient(provider.url, account=T))
            actions = AgentRun(sessions, tenant=T, run_id="run-twice")
            result = await handle_ticket(
                actions, agent, TICKET, model=scripted_model(TICKET, calls=2)
            )
            key = agent.tool_key(actions, "refund", TICKET.tool_arguments())
        calls = [
            part
            for message in result.messages
            for part in getattr(message, "parts", [])
            if isinstance(part, ToolCallPart)
        ]
        first, second = tool_returns(result.messages)
        assert len(calls) == 2 and first.content == second.content
        assert first.content == Refund.model_validate(provider.refunds()[0]).model_dump()
        assert provider.refund_count() == 1 and provider.replays == 0
    assert event_types(db_url, T, key) == ["requested", "started", "succeeded"]


async def test_provider_keys_expire_after_24_hours_by_its_clock(db_url: str) -> None:
    now = [time.time()]
    with PaymentProvider(db_url=db_url, clock=lambda: now[0]) as provider:
        _, _, first = refund(provider.url, "k1")
        now[0] += 24 * 3600 - 1
        _, headers, replay = refund(provider.url, "k1")
        assert headers.get("idempotent-replay") == "true" and replay == first
        assert refund(provider.url, "k1", {**BODY, "amount_cents": 7})[0] == 422
        now[0] += 1  # a day after the first request: the key names a new refund
        status, headers, second = refund(provider.url, "k1", {**BODY, "amount_cents": 7})
        assert status == 201 and "idempotent-replay" not in headers
        assert second["id"] != first["id"] and second["amount_cents"] == 7
        assert provider.refund_count("acme") == 2
        assert (provider.replays, provider.conflicts) == (1, 1)
        _, _, found = lookup(provider.url, "k1")
        assert found["count"] == 2 and found["in_flight"] is False
