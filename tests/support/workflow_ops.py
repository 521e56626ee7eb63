"""A small purchase-order workflow for the operator tests (CLI, metrics), and helpers to drive
it through the real engine: start, approve with a signed signal, run the workers' steps.

``build_engine(sessions)`` is what ``outboxkit workflows ... --app
tests.support.workflow_ops:build_engine --db-url URL`` calls; ``engine`` (this module's
attribute, built on first use from ``OUTBOXKIT_DB_URL``) is the engine-instance form.

The input says how the ``execute`` state behaves: ``ok`` issues the order (keyed effect, with a
compensation) and waits for the delivery; ``flaky`` fails transiently (retried with backoff);
``unknown`` leaves the order's outcome unknown (reconciled once, then human_review).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from outboxkit.outbox import Outbox
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.errors import OutcomeUnknownError, TransientError
from outboxkit.outbox.events import new_event
from outboxkit.workflows import (
    Budget,
    CompensationContext,
    Complete,
    Goto,
    HmacVerifier,
    Wait,
    Workflow,
    WorkflowContext,
    WorkflowEngine,
    WorkflowRecord,
    request_hash,
    sign,
)
from sqlalchemy.ext.asyncio import async_sessionmaker

from tests.support.waits import scaled

APPROVALS_KEY = b"approvals-test-key"
EVENTS_TOPIC = "wf-ops-events"
SIGNALS_TOPIC = "wf-ops-signals"
ISSUED: list[str] = []

po = Workflow("po", version=1)


@po.state("intake")
async def intake(ctx: WorkflowContext) -> Goto:
    return Goto("await_approval")


@po.state("await_approval")
async def await_approval(ctx: WorkflowContext) -> Wait:
    return Wait(
        on={"approval.granted": "execute", "approval.rejected": "rejected"},
        deadline_s=3600,
        sources=("approvals",),
        approval_for={"amount": ctx.input["amount"]},
    )


@po.state(
    "execute",
    budget=Budget(max_attempts=3, backoff=Backoff(base_s=0.2, cap_s=0.2, floor_s=0.2)),
)
async def execute(ctx: WorkflowContext) -> Goto:
    ctx.require_approval({"amount": ctx.input["amount"]})
    mode = ctx.input.get("mode", "ok")
    if mode == "flaky":
        raise TransientError("supplier API answered 503")
    key = f"{ctx.workflow_id}:issue:v1"

    async def issue(idempotency_key: str) -> dict[str, Any]:
        if mode == "unknown":
            raise OutcomeUnknownError("gateway timeout after the request was sent")
        ISSUED.append(idempotency_key)
        return {"order": f"o-{ctx.workflow_id}"}

    order = await ctx.effect(
        "orders.issue", key=key, params={"amount": ctx.input["amount"]}, run=issue
    )
    ctx.compensate_with("orders.cancel", {"order": order["order"]}, effect_key=key)
    return Goto("await_delivery")


@po.state("await_delivery")
async def await_delivery(ctx: WorkflowContext) -> Wait:
    return Wait(on={"delivery.confirmed": "done"}, deadline_s=3600, sources=("suppliers",))


@po.state("done")
async def done(ctx: WorkflowContext) -> Complete:
    return Complete(result={"delivered": True})


@po.compensation("orders.cancel", authorised_by="ops")
async def cancel_order(c: CompensationContext) -> dict[str, Any]:
    return {"cancelled": c.params}


def build_engine(
    sessions: async_sessionmaker, clock: Any = time.time, events_topic: str = EVENTS_TOPIC
) -> WorkflowEngine:
    """The engine of the ``po`` workflow on ``sessions``."""
    return WorkflowEngine(
        [po],
        sessions=sessions,
        outbox=Outbox(default_topic=events_topic),
        events_topic=events_topic,
        signals_topic=SIGNALS_TOPIC,
        verifier=HmacVerifier({"approvals": APPROVALS_KEY}),
        clock=clock,
    )


def __getattr__(name: str) -> Any:
    if name == "engine":  # the engine-instance form, on OUTBOXKIT_DB_URL
        url = os.environ["OUTBOXKIT_DB_URL"]
        return build_engine(async_sessionmaker(make_async_engine(url), expire_on_commit=False))
    raise AttributeError(name)


async def start(
    engine: WorkflowEngine, workflow_id: str, *, mode: str = "ok", tenant: str = "acme"
) -> WorkflowRecord:
    """Start ``workflow_id`` (amount 5) in its own transaction."""
    async with engine.sessions() as session, session.begin():
        return await engine.start(
            session, "po", workflow_id, {"amount": 5, "mode": mode}, tenant=tenant, owner="alice"
        )


async def start_many(url: str, count: int) -> None:
    """Start ``PO-0`` .. ``PO-<count - 1>`` of tenant acme on ``url`` (runnable, no worker)."""
    from tests.support.actions import sessions_for

    async with sessions_for(url) as sessions:
        engine = build_engine(sessions)
        for n in range(count):
            await start(engine, f"PO-{n}")


async def get(engine: WorkflowEngine, workflow_id: str, tenant: str = "acme") -> WorkflowRecord:
    async with engine.sessions() as session:
        record = await engine.get(session, tenant, workflow_id)
    assert record is not None
    return record


async def approve(
    engine: WorkflowEngine, workflow_id: str, *, tenant: str = "acme", event_id: str | None = None
) -> Any:
    """Deliver a signed ``approval.granted`` for the instance's current wait; the outcome."""
    record = await get(engine, workflow_id, tenant)
    assert record.wait is not None, record.state
    ext = {
        "workflowid": workflow_id,
        "tenantid": tenant,
        "correlationid": record.wait.correlation,
        "requesthash": request_hash({"amount": 5}),
    }
    data = {"by": "boss"}
    event_id = event_id or f"approval-{workflow_id}"
    ext["authsig"] = sign(
        APPROVALS_KEY,
        source="approvals",
        id=event_id,
        type="approval.granted",
        extensions=ext,
        data=data,
    )
    event = new_event("approval.granted", "approvals", data, id=event_id, extensions=ext)
    async with engine.sessions() as session, session.begin():
        return await engine.deliver(session, event)


async def settle(engine: WorkflowEngine, workflow_id: str, until: Any, timeout_s: float = 30.0):
    """Run the workers' steps until ``until(record)`` holds; the record (``timeout_s`` is a
    quiet machine's figure, scaled for the load)."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        record = await get(engine, workflow_id)
        if until(record):
            return record
        assert time.monotonic() < deadline, f"{workflow_id} stuck in {record.state}"
        if await engine.run_due(limit=10) == 0:
            await asyncio.sleep(0.05)  # a retry's backoff (0.2 s) is due soon: poll for it
