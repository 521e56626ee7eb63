"""The agent ledger and HTTP idempotency keep working across a Patroni failover, through HAProxy.

Calls go on all along, each retried by its caller with the same key until it has an answer, as
an agent framework or an HTTP client does; the primary's postmaster is killed meanwhile. Every
call must end with one execution of its side effect, and no operation or key may be left
RUNNING (in progress) for a lease to free.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from outboxkit.actions import ActionStore, State, run_action
from outboxkit.actions.tables import agent_operations
from outboxkit.idempotency.tables import IN_PROGRESS, http_idempotency_keys
from outboxkit.outbox.db import make_engine
from outboxkit.testing.patroni import PatroniCluster
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError

from tests.ha.flow import Fault, first_line, outage
from tests.idempotency.test_http import count, headers, service
from tests.support.actions import sessions_for
from tests.support.idempotent_app import Controls, count_payments

TENANT = "acme"
CALL_PAUSE_S = 0.05


class Calls:
    """Keys called one after another until :meth:`stop`, each retried until it answers;
    ``answered`` holds when each key got its answer, ``errors`` what the retries met."""

    def __init__(self) -> None:
        self.answered: list[float] = []
        self.errors: Counter[str] = Counter()
        self.keys: list[str] = []
        self.done = asyncio.Event()

    async def run(self, call: Any) -> None:
        while not self.done.is_set():
            key = f"k-{len(self.keys)}"
            self.keys.append(key)
            for _ in range(600):
                try:
                    await call(key)
                    break
                except (DBAPIError, OSError, httpx.HTTPError, RetryableStatusError) as error:
                    self.errors[f"{type(error).__name__}: {first_line(error)[:120]}"] += 1
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"{key} never answered: {self.errors}")
            self.answered.append(time.time())
            await asyncio.sleep(CALL_PAUSE_S)


class RetryableStatusError(Exception):
    """A 5xx or 409 (in progress) answer: the client tries the same key again."""


def said(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    """What ``logger`` said, one entry a line: level and the message up to its details."""
    return [
        f"{record.levelname} {record.getMessage().split(':')[0].split(' after ')[0]}"
        + (" after" if " after " in record.getMessage() else "")
        for record in caplog.records
        if record.name == logger and record.levelno >= logging.INFO
    ]


def states(url: str, table: Any, column: Any) -> Counter[str]:
    """How many rows of ``table`` are in each state."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(column, func.count()).select_from(table).group_by(column))
            return Counter({str(state): int(n) for state, n in rows})
    finally:
        engine.dispose()


async def through_a_failover(cluster: PatroniCluster, calls: Calls, call: Any) -> Fault:
    """Run ``calls`` of ``call``, fail the primary over once 20 answered, stop 20 after."""
    task = asyncio.create_task(calls.run(call))
    try:
        while len(calls.answered) < 20:
            assert not task.done(), task
            await asyncio.sleep(0.1)
        fault = Fault("failover", time.time())
        await asyncio.to_thread(cluster.failover)
        fault.settled = time.time()
        wanted = len(calls.answered) + 20
        while len(calls.answered) < wanted:
            assert not task.done(), task
            await asyncio.sleep(0.1)
    finally:
        calls.done.set()
        await task
    return fault


async def test_ledger_tool_calls_through_haproxy_survive_a_failover(
    ha_cluster: PatroniCluster, ha_db: str
) -> None:
    executed: Counter[str] = Counter()
    store = ActionStore()

    async with sessions_for(ha_db) as sessions:

        async def tool_call(key: str) -> None:
            async def refund(op_key: str) -> dict[str, str]:
                executed[key] += 1
                return {"refund": op_key}

            outcome = await run_action(
                sessions, store, refund, tenant=TENANT, key=key, action_type="refund",
                params={"key": key}, timeout_s=10,
            )  # fmt: skip
            assert outcome.operation.state is State.SUCCEEDED

        calls = Calls()
        fault = await through_a_failover(ha_cluster, calls, tool_call)
    by_state = states(ha_db, agent_operations, agent_operations.c.state)
    assert by_state == Counter({"SUCCEEDED": len(calls.keys)}), by_state
    assert all(executed[key] == 1 for key in calls.keys), executed - Counter(calls.keys)
    print(
        f"\nledger through HAProxy: {len(calls.keys)} tool calls, each executed once, none "
        f"RUNNING; outage {outage(calls.answered, fault):.2f} s; retried on {dict(calls.errors)}"
    )


async def test_http_idempotency_through_haproxy_survives_a_failover(
    ha_cluster: PatroniCluster, ha_db: str
) -> None:
    async with service(ha_db) as client:

        async def post(key: str) -> None:
            response = await client.post(
                "/payments", json={"amount_cents": 100}, headers=headers(key)
            )
            if response.status_code >= 500 or response.status_code == 409:
                raise RetryableStatusError(f"{response.status_code} {response.text[:100]}")
            assert response.status_code == 201, response.text

        calls = Calls()
        fault = await through_a_failover(ha_cluster, calls, post)
    assert count_payments(ha_db) == len(calls.keys), "a payment was made twice or not at all"
    by_state = states(ha_db, http_idempotency_keys, http_idempotency_keys.c.state)
    assert by_state[IN_PROGRESS] == 0, by_state
    assert count(ha_db, http_idempotency_keys) == len(calls.keys)
    print(
        f"\nHTTP idempotency through HAProxy: {len(calls.keys)} requests, one payment each, none "
        f"in progress; outage {outage(calls.answered, fault):.2f} s; retried on "
        f"{dict(calls.errors)}"
    )


async def test_a_tool_call_whose_effect_lands_as_the_primary_crashes_is_recorded_succeeded(
    ha_cluster: PatroniCluster, ha_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The side effect is done, then the primary dies before the ledger records it: the
    result, still in the worker's hands, must be recorded once the new primary takes writes
    (within the lease), not left RUNNING to become UNKNOWN."""
    caplog.set_level(logging.INFO, logger="outboxkit.actions")
    executed: Counter[str] = Counter()
    async with sessions_for(ha_db) as sessions:

        async def refund(op_key: str) -> dict[str, str]:
            executed[op_key] += 1
            ha_cluster.crash_primary()
            return {"refund": op_key}

        began = time.monotonic()
        outcome = await run_action(
            sessions, ActionStore(), refund, tenant=TENANT, key="crash", action_type="refund",
            params={}, timeout_s=10,
        )  # fmt: skip
        recorded_s = time.monotonic() - began
    await asyncio.to_thread(ha_cluster.wait_healthy)
    assert outcome.operation.state is State.SUCCEEDED and outcome.executed
    assert sum(executed.values()) == 1
    by_state = states(ha_db, agent_operations, agent_operations.c.state)
    assert by_state == Counter({"SUCCEEDED": 1}), by_state
    assert said(caplog, "outboxkit.actions") == [
        "WARNING database unreachable while writing an action's success",
        "INFO wrote an action's success after",
    ]
    print(f"\nledger: the outcome of a call cut by a crash recorded after {recorded_s:.1f} s")


async def test_a_request_cut_by_a_primary_crash_releases_its_key_for_the_retry(
    ha_cluster: PatroniCluster, ha_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler has written, then the primary dies before the commit: its work is lost with
    the transaction, so the key must be released once the new primary takes writes, and the
    client's retry executes (not 409 "in progress" until the 30 s lease ends)."""
    caplog.set_level(logging.INFO, logger="outboxkit.idempotency")
    controls = Controls(gate=asyncio.Event())
    async with service(ha_db, controls=controls) as client:
        first = asyncio.create_task(
            client.post("/payments", json={"amount_cents": 100}, headers=headers("cut"))
        )
        await asyncio.wait_for(controls.reached.wait(), 60)
        began = time.monotonic()
        ha_cluster.crash_primary()
        controls.gate.set()
        cut = await first
        answered_s = time.monotonic() - began
        await asyncio.to_thread(ha_cluster.wait_healthy)
        retried = await client.post("/payments", json={"amount_cents": 100}, headers=headers("cut"))
    assert cut.status_code == 500
    assert retried.status_code == 201, retried.text
    assert count_payments(ha_db) == 1
    assert states(ha_db, http_idempotency_keys, http_idempotency_keys.c.state)[IN_PROGRESS] == 0
    assert said(caplog, "outboxkit.idempotency") == [
        "WARNING database unreachable while writing the release of an idempotency claim",
        "INFO wrote the release of an idempotency claim after",
    ]
    print(f"\nHTTP: the request cut by a crash answered 500 after {answered_s:.1f} s, key released")
