"""An approval request outlives the ledger's retention while it waits, on SQLite and PostgreSQL:
``actions cleanup`` keeps a request awaiting a decision even past its expiry, and an approval
that would stay open longer than the ledger keeps records is refused before it is recorded."""

from __future__ import annotations

import pytest
from outboxkit.actions import ActionStore
from outboxkit.actions.cleanup import purge_expired
from outboxkit.actions.tables import agent_operations
from outboxkit.agents import AgentRun, AgentRunError
from outboxkit.agents.approvals import decide, request_approval
from sqlalchemy import func, select, update

from tests.support.actions import in_tx, sessions_for
from tests.support.approvals import DAY_S

T = "acme"


async def _rows(sessions, awaiting: bool = False) -> int:
    """The ledger's rows (``awaiting``: those awaiting a decision)."""
    query = select(func.count()).select_from(agent_operations)
    if awaiting:
        query = query.where(agent_operations.c.awaiting_decision.is_(True))
    return int(await in_tx(sessions, lambda s: s.scalar(query)))


async def test_cleanup_keeps_a_request_that_awaits_a_decision(db_url: str) -> None:
    async with sessions_for(db_url) as sessions:
        waiting = AgentRun(sessions, tenant=T, run_id="waiting")
        decided = AgentRun(sessions, tenant=T, run_id="decided")
        await request_approval(waiting, "c-1", "refund", {"amount": 5}, 3 * DAY_S)
        pending = await request_approval(decided, "c-1", "refund", {"amount": 6}, 3 * DAY_S)
        await decide(decided, "c-1", args_hash=pending.args_hash, by="alice")
        assert await _rows(sessions) == 3  # two requests and one decision
        # Every record past its expiry, as if the ledger's ttl_s had gone by.
        await in_tx(sessions, lambda s: s.execute(update(agent_operations).values(expires_ms=0)))

        assert await purge_expired(sessions) == 2
        assert await _rows(sessions) == 1 and await _rows(sessions, awaiting=True) == 1


async def test_an_approval_open_longer_than_the_ledger_keeps_records_is_refused(
    db_url: str,
) -> None:
    async with sessions_for(db_url) as sessions:
        run = AgentRun(sessions, tenant=T, run_id="r", store=ActionStore(ttl_s=DAY_S))
        with pytest.raises(AgentRunError, match="longer than the ledger's ttl_s"):
            await request_approval(run, "c-1", "refund", {"amount": 5}, 3 * DAY_S)
        assert await _rows(sessions) == 0
        await request_approval(run, "c-1", "refund", {"amount": 5}, DAY_S)
        assert await _rows(sessions, awaiting=True) == 1
        assert AgentRun(sessions, tenant=T, run_id="d").store.ttl_s == 30 * DAY_S
