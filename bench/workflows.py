"""Durable workflows under load, with a worker process killed mid-run: throughput and recovery.

N instances (default 1,000) of a 4-state workflow (intake -> plan -> execute, one keyed effect
through the agent-action ledger -> finish -> complete) are started on a fresh PostgreSQL
database, then two worker processes (``WorkflowWorker``, LISTEN/NOTIFY) work through them. Once
40% of the transitions are written, one worker is SIGKILLed; the other carries on alone. Sampled
every 0.2 s: transitions written, and the age of the oldest work held under a lease (claimed,
not yet advanced: a live worker's are milliseconds old, the killed worker's age until their
lease runs out and the survivor claims them). Every instance must complete with exactly one
effect. Usage:

    python -m bench.workflows [--instances 1000] [--lease 5] [--kill-at 0.4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from outboxkit.actions import ActionStore
from outboxkit.outbox import Outbox
from outboxkit.outbox.db import make_async_engine
from outboxkit.workflows import (
    Budget,
    Complete,
    Goto,
    Next,
    Workflow,
    WorkflowContext,
    WorkflowEngine,
    WorkflowWorker,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import async_sessionmaker

from bench.common import postgres_database, report

ROOT = Path(__file__).resolve().parents[1]
TENANT = "bench"
HANDLER_STATES = 4  # transitions per instance after its start

flow = Workflow("bench_flow", version=1, budget=Budget(step_timeout_s=2.0))


@flow.state("intake")
async def intake(ctx: WorkflowContext) -> Next:
    ctx.data["n"] = ctx.input["n"]
    return Goto("plan")


@flow.state("plan")
async def plan(ctx: WorkflowContext) -> Next:
    return Goto("execute", decision={"amount": ctx.input["n"] % 100})


@flow.state("execute")
async def execute(ctx: WorkflowContext) -> Next:
    async def effect(idempotency_key: str) -> Any:
        return {"done": idempotency_key}

    key = f"{ctx.workflow_id}:effect:v1"
    ctx.data["effect"] = await ctx.effect("bench.effect", key=key, params={}, run=effect)
    return Goto("finish")


@flow.state("finish")
async def finish(ctx: WorkflowContext) -> Next:
    return Complete(result={"n": ctx.data["n"]})


def engine_for(sessions: Any, lease_s: float) -> WorkflowEngine:
    """The bench's engine (short instance and action leases, so a kill recovers quickly)."""
    engine = WorkflowEngine(
        [flow],
        sessions=sessions,
        outbox=Outbox(default_topic="bench.workflow-actions"),
        action_store=ActionStore(lease_s=max(1.0, lease_s / 2)),
        lease_s=lease_s,
    )
    return engine


async def serve(url: str, lease_s: float) -> None:
    """Worker process: work until SIGTERM (or SIGKILL)."""
    engine = make_async_engine(url, pool_size=6, max_overflow=0)
    worker = WorkflowWorker(
        engine_for(async_sessionmaker(engine, expire_on_commit=False), lease_s),
        batch=10,
        poll_interval_s=0.5,
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(worker.stop()))
    try:
        await worker.run()
    finally:
        await engine.dispose()


async def start_instances(url: str, count: int, lease_s: float) -> None:
    """Start ``count`` instances, 200 per transaction (set-up, not measured)."""
    engine = make_async_engine(url)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    wf_engine = engine_for(sessions, lease_s)
    for first in range(0, count, 200):
        async with sessions() as session, session.begin():
            for n in range(first, min(count, first + 200)):
                await wf_engine.start(session, "bench_flow", f"W-{n:06d}", {"n": n}, tenant=TENANT)
    await engine.dispose()


SAMPLE = text(
    """
    SELECT
      (SELECT count(*) FROM workflow_history WHERE kind <> 'start') AS transitions,
      (SELECT count(*) FROM workflow_instances WHERE state = 'complete') AS complete,
      (SELECT max((extract(epoch FROM clock_timestamp()) * 1000)::bigint
                  - (lease_expires_ms - :lease_ms))
         FROM workflow_instances WHERE lease_holder IS NOT NULL AND status <> 'done') AS held_ms
    """
)


async def measure(url: str, count: int, lease_s: float, kill_at: float) -> dict[str, Any]:
    """Run two workers, kill one at ``kill_at`` of the work, sample until all complete."""
    engine = make_async_engine(url)
    total = count * HANDLER_STATES
    lease_ms = int(lease_s * 1000)
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.workflows", "--worker", url, "--lease", str(lease_s)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for _ in range(2)
    ]
    samples: list[tuple[float, int, int, int]] = []
    killed_at = recovered_at = None
    held_at_kill: dict[str, int] = {}
    began = time.monotonic()
    try:
        async with engine.connect() as conn:
            while True:
                await asyncio.sleep(0.2)
                row = (await conn.execute(SAMPLE, {"lease_ms": lease_ms})).one()
                await conn.commit()
                now = time.monotonic() - began
                samples.append((now, row.transitions, row.complete, row.held_ms or 0))
                if killed_at is None and row.transitions >= kill_at * total:
                    victim = workers[0]
                    victim.send_signal(signal.SIGKILL)
                    victim.wait(30)
                    killed_at = time.monotonic() - began
                    held = await conn.execute(
                        text(
                            "SELECT workflow_id, seq FROM workflow_instances "
                            "WHERE lease_holder LIKE :pid"
                        ),
                        {"pid": f"%:{victim.pid}:%"},
                    )
                    held_at_kill = {r.workflow_id: r.seq for r in held}
                    await conn.commit()
                elif killed_at is not None and recovered_at is None:
                    if not held_at_kill:
                        recovered_at = killed_at
                    else:
                        rows = await conn.execute(
                            text(
                                "SELECT workflow_id, seq FROM workflow_instances "
                                "WHERE workflow_id = ANY(:ids)"
                            ),
                            {"ids": list(held_at_kill)},
                        )
                        still = [
                            r.workflow_id for r in rows if r.seq == held_at_kill[r.workflow_id]
                        ]
                        await conn.commit()
                        if not still:
                            recovered_at = time.monotonic() - began
                if row.complete >= count:
                    break
                if now > 600:
                    raise RuntimeError(f"not done after 600 s: {row}")
            effects = (
                await conn.execute(
                    text(
                        "SELECT count(*), count(DISTINCT op_key) FROM agent_operations "
                        "WHERE action_type = 'bench.effect' AND state = 'SUCCEEDED'"
                    )
                )
            ).one()
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(60)
        await engine.dispose()
    finished = samples[-1][0]
    transitions = samples[-1][1]
    before = [s for s in samples if killed_at is None or s[0] <= killed_at]
    first = next((s for s in samples if s[1] > 0), samples[0])
    rate_before = (before[-1][1] - first[1]) / max(before[-1][0] - first[0], 1e-9)
    return {
        "instances": count,
        "workers": 2,
        "lease_s": lease_s,
        "transitions": transitions,
        "seconds": round(finished, 2),
        "transitions_per_s": round(transitions / finished, 1),
        "transitions_per_s_before_kill": round(rate_before, 1),
        "killed_at_s": round(killed_at or 0.0, 2),
        "held_by_killed_worker": len(held_at_kill),
        "recovery_s": None
        if recovered_at is None or killed_at is None
        else round(recovered_at - killed_at, 2),
        "oldest_held_work_max_s": round(max(s[3] for s in samples) / 1000, 2),
        "oldest_held_work_before_kill_max_s": round(
            max((s[3] for s in samples if killed_at is None or s[0] < killed_at), default=0) / 1000,
            2,
        ),
        "effects": effects[0],
        "distinct_effect_keys": effects[1],
        "samples": samples,
    }


def main() -> None:
    """Parse the arguments; run the bench (or, with ``--worker URL``, one worker process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--lease", type=float, default=5.0, help="instance lease, seconds")
    parser.add_argument("--kill-at", type=float, default=0.4, help="share of the work done")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(serve(args.worker, args.lease))
        return
    with postgres_database() as url:
        asyncio.run(start_instances(url, args.instances, args.lease))
        data = asyncio.run(measure(url, args.instances, args.lease, args.kill_at))
    if data["effects"] != args.instances or data["distinct_effect_keys"] != args.instances:
        raise SystemExit(f"effects: {data['effects']} for {args.instances} instances")
    report(
        "workflows",
        f"{args.instances} workflows x {HANDLER_STATES} transitions, 2 workers, one killed",
        ["measure", "value"],
        [
            ["transitions/s (whole run)", data["transitions_per_s"]],
            ["transitions/s (2 workers, before the kill)", data["transitions_per_s_before_kill"]],
            ["seconds", data["seconds"]],
            ["killed at (s)", data["killed_at_s"]],
            ["instances held by the killed worker", data["held_by_killed_worker"]],
            ["recovery (s, kill -> all of them advanced)", data["recovery_s"]],
            ["oldest held work, max (s)", data["oldest_held_work_max_s"]],
            [
                "oldest held work before the kill, max (s)",
                data["oldest_held_work_before_kill_max_s"],
            ],
            ["effects (distinct keys)", f"{data['effects']} ({data['distinct_effect_keys']})"],
        ],
        {key: value for key, value in data.items() if key != "samples"}
        | {"samples": data["samples"][::5]},
    )


if __name__ == "__main__":
    main()
