"""The ledger, idempotency and workflow hot paths of bench.growth, and their fills.

Fills are ``INSERT ... SELECT`` over ``generate_series`` on the server (as bench.console fills
its tables; set-up, not measured): finished agent operations with one audit row each, completed
HTTP idempotency keys with a small stored response, finished workflow instances with
``history_per_instance`` history rows each. The paths call the stores as the framework does:

- ledger: ``ActionStore.claim_new`` of a new key (one autocommit statement on PostgreSQL);
- idempotency: ``IdempotencyStore.claim`` of a new key and ``complete``, one transaction;
- workflows: ``WorkflowEngine.start`` of an instance (one transaction), then ``run_due`` until
  its four transitions are written (bench.workflows' flow, one ledger effect).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable

from outboxkit.actions import ActionStore
from outboxkit.idempotency.fingerprint import fingerprint
from outboxkit.idempotency.store import ClaimKind, IdempotencyStore
from outboxkit.outbox.db import make_async_engine
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench.growth_paths import Timing
from bench.growth_tables import asyncpg_dsn
from bench.workflows import HANDLER_STATES, engine_for

TENANTS = 10
WARM_UP = 20


def fill_statements(
    kind: str, count: int, now: int, history_per_instance: int, expired: int
) -> list[str]:
    """The set-up statements of ``kind`` (``ledger``, ``idempotency``, ``workflows``); the
    first ``expired`` operations or keys are past their expiry (retention deletes them), the
    others expire one second apart."""
    if kind == "ledger":
        return [
            f"""INSERT INTO agent_operations (tenant, op_key, generation, action_type,
                params_hash, state, attempts, needs_attention, result, created_ms, updated_ms,
                expires_ms)
            SELECT 't' || (g % {TENANTS}), 'op-' || g, 1, 'payments.charge', md5(g::text),
                CASE WHEN g % 50 = 0 THEN 'FAILED_FINAL' ELSE 'SUCCEEDED' END, 1, false,
                '{{"ok":true}}', {now} - g, {now} - g, {now} + (g::bigint - {expired}) * 1000
            FROM generate_series(1, {count}) AS g""",
            f"""INSERT INTO agent_operation_audit (tenant, op_key, generation, attempt,
                from_state, to_state, at_ms, actor, reason)
            SELECT 't' || (g % {TENANTS}), 'op-' || g, 1, 1, 'RUNNING', 'SUCCEEDED', {now} - g,
                'agent', 'succeeded'
            FROM generate_series(1, {count}) AS g""",
        ]
    if kind == "idempotency":
        return [
            f"""INSERT INTO http_idempotency_keys (scope, idem_key, fingerprint,
                fingerprint_parts, state, response_status, response_headers, response_body,
                created_ms, completed_ms, expires_ms)
            SELECT 'POST /orders', gen_random_uuid()::text, md5(g::text) || md5(g::text),
                '{{}}', 'completed', 201, '[]', '\\x7b226964223a317d'::bytea, {now} - g,
                {now} - g, {now} + (g::bigint - {expired}) * 1000
            FROM generate_series(1, {count}) AS g"""
        ]
    history = count * history_per_instance
    return [
        f"""INSERT INTO workflow_instances (tenant, workflow_id, name, version, state, status,
            input_hash, data, run_at_ms, attempts, compensations, seq, entered_seq,
            state_since_ms, created_ms, updated_ms)
        SELECT 't' || (g % {TENANTS}), 'wf-' || g, 'bench_flow', 1, 'complete', 'done',
            md5(g::text), '{{"input":{{"n":1}}}}', NULL, 0, '[]', {history_per_instance},
            {history_per_instance}, {now} - g, {now} - g * 2, {now} - g
        FROM generate_series(1, {count}) AS g""",
        f"""INSERT INTO workflow_history (tenant, workflow_id, seq, name, version, kind,
            from_state, to_state, trigger, steps, observations, data, attempt, actor, at_ms)
        SELECT 't' || (g / {history_per_instance} % {TENANTS}),
            'wf-' || (g / {history_per_instance}), g % {history_per_instance} + 1, 'bench_flow',
            1, 'advance', 'plan', 'execute', '{{"kind":"due"}}', '[]', '[]', '{{"n":1}}', 1,
            'worker', {now} - g
        FROM generate_series(0, {history} - 1) AS g""",
    ]


TABLES = {
    "ledger": "agent_operations",
    "idempotency": "http_idempotency_keys",
    "workflows": "workflow_history",
}


async def fill(
    url: str, kind: str, count: int, *, history_per_instance: int = 20, expired: int = 0
) -> float:
    """Fill the tables of ``kind`` with ``count`` rows (instances); seconds it took."""
    import asyncpg

    began = time.monotonic()
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        now = int(time.time() * 1000)
        for statement in fill_statements(kind, count, now, history_per_instance, expired):
            await connection.execute(statement)
    finally:
        await connection.close()
    return time.monotonic() - began


async def _timed(
    url: str, calls: int, one: Callable[[async_sessionmaker[AsyncSession], int], Awaitable[int]]
) -> Timing:
    """``calls`` calls of ``one(sessions, n)`` (it returns the events it wrote) after a warm-up."""
    engine = make_async_engine(url)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    times: list[float] = []
    events = 0
    try:
        for n in range(WARM_UP + calls):
            began = time.perf_counter()
            done = await one(sessions, n)
            if n >= WARM_UP:
                times.append(time.perf_counter() - began)
                events += done
    finally:
        await engine.dispose()
    return Timing(events, sum(times), [t * 1000 for t in times])


async def ledger_path(url: str, calls: int) -> Timing:
    """``ActionStore.claim_new`` of ``calls`` new keys, each its own autocommit statement."""
    store = ActionStore()
    run = uuid.uuid4().hex[:8]

    async def one(sessions: async_sessionmaker[AsyncSession], n: int) -> int:
        async with sessions() as session:
            # as run_action sends it: one autocommit statement, no BEGIN/COMMIT
            await session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
            decision = await store.claim_new(
                session, tenant=f"t{n % TENANTS}", key=f"new-{run}-{n}",
                action_type="payments.charge", params={"amount": n},
            )  # fmt: skip
        assert decision is not None, "a new key was not claimed in one statement"
        return 1

    return await _timed(url, calls, one)


async def idempotency_path(url: str, calls: int) -> Timing:
    """``IdempotencyStore.claim`` of a new key and ``complete`` with a small response."""
    store = IdempotencyStore()
    request = fingerprint("POST", "/orders", b"", b'{"amount":1}', [])

    async def one(sessions: async_sessionmaker[AsyncSession], n: int) -> int:
        async with sessions() as session, session.begin():
            claim = await store.claim(session, "POST /orders", str(uuid.uuid4()), request)
            assert claim.kind is ClaimKind.EXECUTE and claim.lease is not None, claim
            assert await store.complete(session, claim.lease, 201, [], b'{"id":1}')
        return 1

    return await _timed(url, calls, one)


async def workflow_path(url: str, calls: int) -> Timing:
    """Start an instance, then ``run_due`` until its transitions are written: 1 + 4 events."""
    run = uuid.uuid4().hex[:8]
    holder = f"growth-{run}"

    async def one(sessions: async_sessionmaker[AsyncSession], n: int) -> int:
        engine = engine_for(sessions, 30.0)
        async with sessions() as session, session.begin():
            await engine.start(session, "bench_flow", f"new-{run}-{n}", {"n": n}, tenant="bench")
        advanced = 0
        while advanced < HANDLER_STATES:
            claimed = await engine.run_due(holder=holder, limit=10)
            assert claimed, "the new instance was not due"
            advanced += claimed
        return 1 + HANDLER_STATES

    return await _timed(url, calls, one)


PATHS = {"ledger": ledger_path, "idempotency": idempotency_path, "workflows": workflow_path}


async def check_workflows_done(url: str) -> int:
    """Instances started by the bench that are not complete (0 expected)."""
    engine = make_async_engine(url)
    try:
        async with engine.connect() as connection:
            left = await connection.scalar(
                text(
                    "SELECT count(*) FROM workflow_instances "
                    "WHERE workflow_id LIKE 'new-%' AND status <> 'done'"
                )
            )
    finally:
        await engine.dispose()
    return int(left or 0)
