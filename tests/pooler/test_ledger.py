"""Agent tool calls through PgBouncer in transaction mode (Debian's 1.18): with the database URL
as docs/deploy.md gives it (``?pooler=transaction``), the ledger's fast path (one statement on
the driver's connection per step) works; without it, a call fails with one line naming it."""

from __future__ import annotations

import asyncio
from collections import Counter

from outboxkit.actions import ActionStore, State, run_action
from outboxkit.actions.tables import agent_operations
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.pooler import PoolerSettingError
from outboxkit.testing.pgbouncer import PgBouncer
from sqlalchemy import func, select

from tests.support.actions import sessions_for

T = "acme"
CALLS = 160


async def test_160_concurrent_tool_calls_through_the_pooler_all_succeed_once(
    pgbouncer: PgBouncer, pgbouncer_url: str
) -> None:
    await pgbouncer.fill_pool(pgbouncer_url)
    effects: Counter[str] = Counter()

    async def lookup(idempotency_key: str) -> dict[str, str]:
        effects[idempotency_key.split(":")[0]] += 1
        await asyncio.sleep(0)  # the other calls' statements interleave with this one's
        return {"status": "shipped"}

    store = ActionStore()
    async with sessions_for(f"{pgbouncer_url}?pooler=transaction", pool_size=20) as sessions:

        async def call(n: int) -> State:
            outcome = await run_action(
                sessions, store, lookup, tenant=T, key=f"call-{n}",
                action_type="agent.tool.lookup", params={"n": n}, timeout_s=30,
            )  # fmt: skip
            return outcome.operation.state

        states = await asyncio.gather(*(call(n) for n in range(CALLS)))
    assert Counter(states) == {State.SUCCEEDED: CALLS}
    assert effects == {f"call-{n}": 1 for n in range(CALLS)}
    engine = make_engine(f"{pgbouncer_url}?pooler=transaction")
    try:
        with engine.connect() as connection:
            by_state = dict(
                connection.execute(
                    select(agent_operations.c.state, func.count()).group_by(
                        agent_operations.c.state
                    )
                ).all()
            )
    finally:
        engine.dispose()
    assert by_state == {"SUCCEEDED": CALLS}  # none left RUNNING


async def test_without_the_setting_a_prepared_statement_failure_names_it(
    pgbouncer: PgBouncer, pgbouncer_url: str
) -> None:
    async def lookup(_key: str) -> str:
        return "ok"

    store = ActionStore()
    await pgbouncer.fill_pool(pgbouncer_url)
    async with sessions_for(pgbouncer_url, pool_size=20) as sessions:
        results = await asyncio.gather(
            *(
                run_action(
                    sessions,
                    store,
                    lookup,
                    tenant=T,
                    key=f"bare-{n}",
                    action_type="agent.tool.lookup",
                    params={},
                    timeout_s=30,
                )
                for n in range(40)
            ),
            return_exceptions=True,
        )
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures, "40 concurrent calls through PgBouncer without the setting all passed"
    for failure in failures:
        assert isinstance(failure, PoolerSettingError), repr(failure)
        assert "add pooler=transaction to the database URL" in str(failure)
        assert "\n" not in str(failure)
