"""Agent approval requests made through the real API (:mod:`outboxkit.agents.approvals`)."""

from __future__ import annotations

import time
from typing import Any

from outboxkit.agents import AgentRun
from outboxkit.agents.approvals import decide, request_approval

from tests.support.actions import sessions_for

DAY_S = 86400.0


async def request(
    url: str,
    tenant: str,
    run_id: str,
    args: dict[str, Any],
    *,
    call: str = "call-0",
    tool: str = "refund",
    ttl_s: float = 3 * DAY_S,
    age_s: float = 0.0,
    decided: bool = False,
) -> str:
    """Record that ``tool`` of run ``run_id`` waits for approval of ``args``, on a run clock
    ``age_s`` behind now (so ``ttl_s`` below ``age_s`` makes it expired); ``decided``: and
    approve it. Returns the arguments' hash."""
    async with sessions_for(url, pool_size=1) as sessions:
        run = AgentRun(sessions, tenant=tenant, run_id=run_id, clock=lambda: time.time() - age_s)
        pending = await request_approval(run, call, tool, args, ttl_s)
        if decided:
            await decide(run, call, args_hash=pending.args_hash, by="alice")
        return pending.args_hash
