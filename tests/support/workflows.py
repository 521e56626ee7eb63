"""A small refund workflow for the engine's own tests, and helpers to drive it.

``refund`` (v1): intake -> await_approval (a signed approval bound to the request, re-checked
against the refund limit on resume) -> execute (one refund at the example's payment provider,
key ``{workflow_id}:refund:v1``, compensated by ``payments.reverse``) -> notify (one keyed
notification) -> complete. v2 differs where a deploy would show it: its refund key ends in
``:v2`` and it records ``{"flow": "v2"}``.

What the outside world answers (the record's version, the refund limit, whether the
credential is revoked, whether the reversal service works) lives in :data:`WORLD`, one per
process: tests change it in-process; a worker process (:mod:`tests.support.workflow_worker`)
sees the defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Any

from outboxkit.actions import ActionStore, OperationRecord, ReconcileOutcome, Unclear
from outboxkit.outbox import Outbox, OutcomeUnknownError, TransientError, new_event
from outboxkit.outbox.backoff import Backoff
from outboxkit.workflows import (
    AuthorizationError,
    Budget,
    CompensationContext,
    Complete,
    Goto,
    HmacVerifier,
    Next,
    PolicyError,
    Wait,
    Workflow,
    WorkflowContext,
    WorkflowEngine,
    WorkflowRecord,
    request_hash,
    sign,
)

from examples.refund_agent.payments import PaymentsClient
from tests.support.actions import sessions_for
from tests.support.waits import scaled

NAME = "refund"
TENANT = "acme"
APPROVALS = "approvals"
APPROVALS_KEY = b"approvals-test-key"
STATES = ("intake", "await_approval", "execute", "notify")
"""The definition's own states, in the order a happy run visits them."""


@dataclass
class World:
    """What outside systems answer, per process (tests change it; workers see the defaults)."""

    record_versions: dict[str, int] = field(default_factory=dict)
    limit_cents: int = 1_000_000
    revoked: set[str] = field(default_factory=set)
    token_uses: dict[str, int] = field(default_factory=dict)
    reversal_broken: bool = False
    reversals: list[str] = field(default_factory=list)
    notifications: list[str] = field(default_factory=list)
    effect_gate: asyncio.Event | None = None
    """When set, the refund waits for it (after its call began): a test cancels meanwhile."""
    effect_started: asyncio.Event = field(default_factory=asyncio.Event)
    lookup_down: bool = False
    """The provider's lookup answers nothing useful: reconciling stays unclear."""
    policy_refuses: bool = False
    refund_transient: bool = False
    """Every refund call fails with a TransientError before reaching the provider."""
    intake_transient: bool = False
    """Every run of intake fails with a TransientError."""
    calls: dict[str, int] = field(default_factory=dict)
    """Runs of intake and refund calls, counted."""

    def count(self, what: str) -> None:
        """Count one call of ``what``."""
        self.calls[what] = self.calls.get(what, 0) + 1

    def use_token(self, token: str) -> None:
        """Count a call made with ``token``; a revoked one is refused."""
        self.token_uses[token] = self.token_uses.get(token, 0) + 1
        if token in self.revoked:
            raise AuthorizationError(f"credential {token[:4]}... was revoked")


WORLD = World()


def reset_world() -> World:
    """A fresh :data:`WORLD` (the same object, emptied)."""
    WORLD.__init__()  # type: ignore[misc]
    return WORLD


def approval_request(input: dict[str, Any], record_version: int) -> dict[str, Any]:
    """What an approver approves: the refund and the version of the record it was read from."""
    return {
        "charge_id": input["charge_id"],
        "amount_cents": input["amount_cents"],
        "currency": input.get("currency", "EUR"),
        "record_version": record_version,
    }


def refund_input(
    provider_url: str, charge_id: str = "ch_1", amount_cents: int = 1500, **extra: Any
):
    """A workflow input for a refund at the provider behind ``provider_url``."""
    return {
        "provider_url": provider_url,
        "charge_id": charge_id,
        "amount_cents": amount_cents,
        "currency": "EUR",
        "token": "tok-" + charge_id,
        **extra,
    }


def build(version: int = 1, *, step_timeout_s: float = 5.0, max_attempts: int = 3) -> Workflow:
    """A fresh ``refund`` definition at ``version`` (1 or 2)."""
    budget = Budget(
        max_attempts=max_attempts,
        total_s=60.0,
        step_timeout_s=step_timeout_s,
        backoff=Backoff(base_s=0.05, cap_s=0.2),
    )
    wf = Workflow(NAME, version=version, budget=budget, versions={"policy": f"refunds-{version}"})

    async def record_version(ctx: WorkflowContext) -> int:
        async def read() -> int:
            return WORLD.record_versions.get(ctx.workflow_id, 1)

        return await ctx.observe("record_version", read)

    @wf.state("intake")
    async def intake(ctx: WorkflowContext) -> Next:
        WORLD.count("intake")
        if WORLD.intake_transient:
            raise TransientError("the intake service is unavailable")
        ctx.data["record_version"] = await record_version(ctx)
        if version >= 2:
            ctx.data["flow"] = "v2"
        return Goto("await_approval", decision={"amount_cents": ctx.input["amount_cents"]})

    async def within_limit(ctx: WorkflowContext) -> str | None:
        async def read() -> int:
            return WORLD.limit_cents

        limit = await ctx.observe("limit_cents", read)
        return None if ctx.input["amount_cents"] <= limit else "rejected"

    @wf.state("await_approval", rechecks=[within_limit])
    async def await_approval(ctx: WorkflowContext) -> Next:
        ctx.data["record_version"] = await record_version(ctx)
        return Wait(
            on={"approval.granted": "execute", "approval.rejected": "rejected"},
            deadline_s=float(ctx.input.get("approval_deadline_s", 3600)),
            on_deadline=ctx.input.get("on_deadline", "expired"),
            remind_every_s=ctx.input.get("remind_every_s"),
            sources=(APPROVALS,),
            approval_for=approval_request(ctx.input, ctx.data["record_version"]),
        )

    @wf.state("execute")
    async def execute(ctx: WorkflowContext) -> Next:
        ctx.require_approval(approval_request(ctx.input, await record_version(ctx)))
        if WORLD.policy_refuses:
            raise PolicyError("refunds to this charge are blocked by policy")
        client = PaymentsClient(ctx.input["provider_url"], account=ctx.tenant, timeout_s=10)
        params = {k: ctx.input[k] for k in ("charge_id", "amount_cents", "currency")}

        async def refund(idempotency_key: str) -> Any:
            WORLD.count("refund")
            if WORLD.refund_transient:
                raise TransientError("the provider answered 503")
            WORLD.use_token(ctx.input["token"])
            if WORLD.effect_gate is not None:
                WORLD.effect_started.set()
                await WORLD.effect_gate.wait()
            return await client.refund(idempotency_key, **params)

        key = f"{ctx.workflow_id}:refund:v{version}"

        async def lookup(operation: OperationRecord) -> ReconcileOutcome:
            if WORLD.lookup_down:
                return Unclear("the provider's lookup is down")
            return await client.reconcile(operation)

        result = await ctx.effect(
            "payments.refund", key=key, params=params, run=refund, reconciler=lookup
        )
        ctx.compensate_with("payments.reverse", {"refund_id": result["id"]}, effect_key=key)
        ctx.data["refund_id"] = result["id"]
        return Goto("notify")

    @wf.state("notify")
    async def notify(ctx: WorkflowContext) -> Next:
        async def send(idempotency_key: str) -> Any:
            WORLD.notifications.append(idempotency_key)
            return {"sent": True}

        await ctx.effect(
            "customer.notify",
            key=f"{ctx.workflow_id}:notify",
            params={"refund_id": ctx.data["refund_id"]},
            run=send,
        )
        return Complete(result={"refund_id": ctx.data["refund_id"]})

    @wf.compensation("payments.reverse", authorised_by="payments-ops")
    async def reverse(c: CompensationContext) -> Any:
        if WORLD.reversal_broken:
            raise OutcomeUnknownError("the reversal service answered 502")
        WORLD.reversals.append(c.params["refund_id"])
        return {"reversed": c.params["refund_id"]}

    return wf


def make_engine(
    sessions: Any,
    definitions: list[Workflow] | None = None,
    *,
    lease_s: float | None = None,
    action_lease_s: float = 30.0,
    verifier_keys: dict[str, bytes] | None = None,
    **options: Any,
) -> WorkflowEngine:
    """An engine for :func:`build` definitions; ``lease_s`` shortens the instance lease."""
    engine = WorkflowEngine(
        definitions or [build(1)],
        sessions=sessions,
        outbox=Outbox(default_topic="wf-test-actions"),
        verifier=HmacVerifier(verifier_keys or {APPROVALS: APPROVALS_KEY}),
        action_store=ActionStore(lease_s=action_lease_s),
        lease_s=lease_s,
        **options,
    )
    return engine


@contextlib.asynccontextmanager
async def engine_on(url: str, definitions: list[Workflow] | None = None, **options: Any):
    """:func:`make_engine` on a fresh connection pool, disposed afterwards."""
    async with sessions_for(url) as sessions:
        yield make_engine(sessions, definitions, **options)


def approval(
    record: WorkflowRecord,
    request: dict[str, Any],
    *,
    type: str = "approval.granted",
    key: bytes = APPROVALS_KEY,
    source: str = APPROVALS,
    id: str | None = None,
    correlation: str | None = None,
) -> Any:
    """A signed approval CloudEvent answering ``record``'s open wait for ``request``."""
    assert correlation is not None or record.wait is not None, record
    extensions = {
        "workflowid": record.workflow_id,
        "tenantid": record.tenant,
        "correlationid": correlation or record.wait.correlation,  # type: ignore[union-attr]
        "requesthash": request_hash(request),
    }
    data = {"by": "manager"}
    event_id = id or uuid.uuid4().hex
    extensions["authsig"] = sign(
        key, source=source, id=event_id, type=type, extensions=extensions, data=data
    )
    return new_event(type, source, data, id=event_id, extensions=extensions)


async def start(engine: WorkflowEngine, workflow_id: str, input: dict[str, Any]) -> WorkflowRecord:
    """Start ``workflow_id`` in a transaction of its own."""
    async with engine.sessions() as session, session.begin():
        return await engine.start(session, NAME, workflow_id, input, tenant=TENANT)


async def get(engine: WorkflowEngine, workflow_id: str) -> WorkflowRecord:
    """The instance as committed now."""
    async with engine.sessions() as session:
        record = await engine.get(session, TENANT, workflow_id)
    assert record is not None
    return record


async def deliver(engine: WorkflowEngine, event: Any) -> Any:
    """Deliver one signal in a transaction of its own."""
    async with engine.sessions() as session, session.begin():
        return await engine.deliver(session, event)


async def history(engine: WorkflowEngine, workflow_id: str) -> list[Any]:
    """The instance's history records."""
    async with engine.sessions() as session:
        return await engine.history(session, TENANT, workflow_id)


async def settle(engine: WorkflowEngine, rounds: int = 20) -> None:
    """Run due steps until none is due now (at most ``rounds`` ticks)."""
    for _ in range(rounds):
        if await engine.run_due() == 0:
            return


async def until_state(
    engine: WorkflowEngine, workflow_id: str, states: set[str], timeout_s: float = 30.0
) -> WorkflowRecord:
    """Run due steps until the instance is in one of ``states`` (or fail after the timeout)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(timeout_s)
    while True:
        record = await get(engine, workflow_id)
        if record.state in states:
            return record
        if loop.time() > deadline:
            raise AssertionError(f"{workflow_id} stayed in {record.state!r}, not in {states}")
        if await engine.run_due() == 0:
            await asyncio.sleep(0.05)


async def approve(engine: WorkflowEngine, workflow_id: str, **options: Any) -> Any:
    """Drive ``workflow_id`` to its approval wait and deliver a valid approval for it."""
    await until_state(engine, workflow_id, {"await_approval"})
    record = await _until_waiting(engine, workflow_id)
    request = approval_request(record.data["input"], record.data["record_version"])
    return await deliver(engine, approval(record, request, **options))


async def _until_waiting(engine: WorkflowEngine, workflow_id: str) -> WorkflowRecord:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(5)
    while loop.time() < deadline:
        record = await get(engine, workflow_id)
        if record.wait is not None:
            return record
        if await engine.run_due() == 0:
            await asyncio.sleep(0.05)
    raise AssertionError(f"{workflow_id} never began its wait")
