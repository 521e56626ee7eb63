"""The workflow engine's rules, on SQLite and PostgreSQL: starts, signals, waits, failures,
cancels and compensations, each shown by what was executed and what the history holds.

The effect is an in-test ``Supplier`` counting the orders it took (the purchase-order example
and the fault tests run the same rules against real HTTP services and Kafka).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from outboxkit.actions import ActionStore, State
from outboxkit.cli import workflows as cli_workflows
from outboxkit.ops import workflows as ops_workflows
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.errors import PermanentError, TransientError
from outboxkit.outbox.events import new_event
from outboxkit.outbox.writer import Outbox
from outboxkit.workflows import (
    Budget,
    Complete,
    Goto,
    HmacVerifier,
    OperatorActionError,
    PolicyError,
    Wait,
    Workflow,
    WorkflowConflictError,
    WorkflowContext,
    WorkflowEngine,
    request_hash,
    sign,
)
from outboxkit.workflows.records import WorkflowRecord
from sqlalchemy import create_engine, text

from tests.support.actions import sessions_for

T = "acme"
KEY = b"approvals-key"


@dataclass
class Clock:
    """The engine's business clock, moved by the test."""

    now_s: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@dataclass
class Supplier:
    """Counts the orders issued and cancelled; fails as told."""

    orders: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    fail_with: list[Exception] = field(default_factory=list)
    cancel_fails: bool = False

    async def issue(self, idempotency_key: str) -> dict[str, str]:
        if self.fail_with:
            raise self.fail_with.pop(0)
        self.orders.append(idempotency_key)
        return {"order_id": f"o-{len(self.orders)}"}

    async def cancel(self, order_id: str) -> dict[str, str]:
        if self.cancel_fails:
            raise PermanentError("supplier refuses to cancel")
        self.cancelled.append(order_id)
        return {"cancelled": order_id}


def order_workflow(supplier: Supplier) -> Workflow:
    """intake -> await_approval -> execute (one order, compensable) -> complete."""
    wf = Workflow(
        "order",
        version=1,
        budget=Budget(
            max_attempts=3,
            total_s=3600,
            step_timeout_s=10,
            backoff=Backoff(base_s=1.0, cap_s=60.0, floor_s=0.5),  # never due at once
        ),
        redact_keys=("card_number",),
    )

    @wf.state("intake")
    async def intake(ctx: WorkflowContext) -> Goto:
        if ctx.input.get("amount", 0) <= 0:
            return Goto("rejected", decision={"reason": "amount must be positive"})
        if ctx.input.get("policy") == "forbidden":
            raise PolicyError("this supplier is on the deny list")
        if ctx.input.get("explode"):
            raise ValueError("card ERR-SECRET-8888 was declined")
        return Goto("await_approval")

    @wf.state("await_approval")
    async def await_approval(ctx: WorkflowContext) -> Wait:
        return Wait(
            on={"approval.granted": "execute", "approval.rejected": "rejected"},
            deadline_s=3600,
            on_deadline="expired",
            sources=("approvals",),
            approval_for=preview(ctx),
        )

    @wf.state("execute")
    async def execute(ctx: WorkflowContext) -> Complete:
        ctx.require_approval(preview(ctx))
        key = f"{ctx.workflow_id}:issue:v1"
        order = await ctx.effect("orders.issue", key=key, params=preview(ctx), run=supplier.issue)
        ctx.compensate_with("orders.cancel", {"order_id": order["order_id"]}, effect_key=key)
        if ctx.input.get("fail_after_issue"):
            raise PermanentError("the warehouse refused the order")
        return Complete(result=order)

    @wf.compensation("orders.cancel", authorised_by="procurement")
    async def cancel(c: Any) -> Any:
        return await supplier.cancel(c.params["order_id"])

    return wf


def preview(ctx: WorkflowContext) -> dict[str, Any]:
    return {"amount": ctx.data["input"]["amount"], "item": ctx.data["input"].get("item", "x")}


@dataclass
class Harness:
    """An engine on a database, with its clock, supplier and helpers to drive it."""

    engine: WorkflowEngine
    clock: Clock
    supplier: Supplier
    url: str

    async def start(self, workflow_id: str, **input: Any) -> WorkflowRecord:
        async with self.engine.sessions() as session, session.begin():
            return await self.engine.start(session, "order", workflow_id, input, tenant=T)

    async def settle(self, rounds: int = 10) -> None:
        """Run due steps until none is due."""
        for _ in range(rounds):
            if await self.engine.run_due(limit=20) == 0:
                return
        raise AssertionError("work still due after {rounds} rounds")

    async def get(self, workflow_id: str) -> WorkflowRecord:
        async with self.engine.sessions() as session:
            record = await self.engine.get(session, T, workflow_id)
        assert record is not None
        return record

    async def kinds(self, workflow_id: str) -> list[tuple[str, str | None, str]]:
        async with self.engine.sessions() as session:
            history = await self.engine.history(session, T, workflow_id)
        return [(h.kind, h.from_state, h.to_state) for h in history]

    async def signal(
        self,
        workflow_id: str,
        type: str = "approval.granted",
        *,
        id: str = "a-1",
        source: str = "approvals",
        key: bytes = KEY,
        correlation: str | None = None,
        approves: dict[str, Any] | None = None,
    ) -> Any:
        record = await self.get(workflow_id)
        extensions: dict[str, Any] = {"workflowid": workflow_id, "tenantid": T}
        wanted = correlation or (record.wait.correlation if record.wait else None)
        if wanted:
            extensions["correlationid"] = wanted
        if approves is not None:
            extensions["requesthash"] = request_hash(approves)
        data = {"comment": "ok"}
        extensions["authsig"] = sign(
            key, source=source, id=id, type=type, extensions=extensions, data=data
        )
        event = new_event(type, source, data, id=id, extensions=extensions)
        async with self.engine.sessions() as session, session.begin():
            return await self.engine.deliver(session, event)

    def outbox_types(self) -> list[str]:
        engine = create_engine(self.url.replace("+asyncpg", ""))
        try:
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT headers FROM outbox_events ORDER BY id")).all()
        finally:
            engine.dispose()
        return [_ce_type(row[0]) for row in rows]


def _ce_type(headers: Any) -> str:
    return (json.loads(headers) if isinstance(headers, str) else headers)["ce_type"]


@pytest.fixture
async def harness(db_url: str):
    supplier = Supplier()
    clock = Clock()
    async with sessions_for(db_url) as sessions:
        engine = WorkflowEngine(
            [order_workflow(supplier)],
            sessions=sessions,
            outbox=Outbox(default_topic="orders"),
            verifier=HmacVerifier({"approvals": KEY}),
            clock=clock,
        )
        yield Harness(engine, clock, supplier, db_url)


APPROVED = {"amount": 5, "item": "x"}


async def test_an_approved_order_is_issued_once_and_every_transition_is_published(
    harness: Harness,
) -> None:
    await harness.start("PO-1", amount=5)
    await harness.settle()
    assert (await harness.get("PO-1")).state == "await_approval"
    accepted = await harness.signal("PO-1", approves=APPROVED)
    assert accepted.outcome == "accepted"
    await harness.settle()
    record = await harness.get("PO-1")
    assert record.state == "complete" and record.status.value == "done"
    assert harness.supplier.orders == ["PO-1:issue:v1:g1"]
    assert await harness.kinds("PO-1") == [
        ("start", None, "intake"),
        ("transition", "intake", "await_approval"),
        ("wait", "await_approval", "await_approval"),
        ("resume", "await_approval", "execute"),
        ("complete", "execute", "complete"),
    ]
    assert record.approval is not None and record.approval.principal == "approvals"
    types = harness.outbox_types()
    assert types.count("outboxkit.workflow.transitioned") == 5
    assert types.count("outboxkit.workflow.timer") == 1  # the deadline, scheduled


async def test_starting_again_returns_the_instance_and_another_input_conflicts(
    harness: Harness,
) -> None:
    first = await harness.start("PO-2", amount=5)
    again = await harness.start("PO-2", amount=5)
    assert again.id == first.id and again.seq == 1
    with pytest.raises(WorkflowConflictError):
        await harness.start("PO-2", amount=6)


async def test_a_start_rolled_back_leaves_no_instance_and_no_event(harness: Harness) -> None:
    async with harness.engine.sessions() as session:
        async with session.begin():
            await harness.engine.start(session, "order", "PO-3", {"amount": 5}, tenant=T)
            await session.rollback()
        assert await harness.engine.get(session, T, "PO-3") is None
    assert harness.outbox_types() == []


async def test_signals_that_may_not_resume_the_wait_are_refused_with_their_reason(
    harness: Harness,
) -> None:
    await harness.start("PO-4", amount=5)
    await harness.settle()
    forged = await harness.signal("PO-4", id="f-1", key=b"stolen", approves=APPROVED)
    stranger = await harness.signal("PO-4", id="f-2", source="intruders", approves=APPROVED)
    other = await harness.signal("PO-4", id="f-3", correlation="PO-4:x:99", approves=APPROVED)
    changed = await harness.signal("PO-4", id="f-4", approves={"amount": 500, "item": "x"})
    assert [s.outcome for s in (forged, stranger, other, changed)] == ["rejected"] * 4
    assert forged.reason == stranger.reason == "not authenticated"
    assert "correlation" in other.reason and "another request" in changed.reason
    await harness.settle()
    assert (await harness.get("PO-4")).state == "await_approval"
    assert harness.supplier.orders == []
    ok = await harness.signal("PO-4", id="a-ok", approves=APPROVED)
    duplicate = await harness.signal("PO-4", id="a-ok", approves=APPROVED)
    assert ok.outcome == "accepted" and duplicate is None
    await harness.settle()
    assert harness.supplier.orders == ["PO-4:issue:v1:g1"]


async def test_a_deadline_expires_the_wait_and_a_later_callback_is_late(harness: Harness) -> None:
    await harness.start("PO-5", amount=5)
    await harness.settle()
    wait = (await harness.get("PO-5")).wait
    assert wait is not None
    harness.clock.advance(3601)
    await harness.settle()
    assert (await harness.get("PO-5")).state == "expired"
    late = await harness.signal("PO-5", correlation=wait.correlation, approves=APPROVED)
    assert late.outcome == "late" and harness.supplier.orders == []


async def test_transient_failures_retry_within_the_budget_then_a_person_looks(
    harness: Harness,
) -> None:
    harness.supplier.fail_with = [TransientError("503")] * 20
    await harness.start("PO-6", amount=5)
    await harness.settle()
    await harness.signal("PO-6", approves=APPROVED)
    runs = 0
    while (record := await harness.get("PO-6")).state != "human_review":
        runs += 1
        assert runs < 10, "the budget did not stop the retries"
        await harness.settle()
        harness.clock.advance(600)  # past any backoff
    assert record.review_from == "execute" and record.failure_class == "transient"
    assert harness.supplier.orders == []
    # bounded: 3 tries in the first run (the ledger's), 1 in each of the 2 later runs
    assert len(harness.supplier.fail_with) == 20 - 5
    async with harness.engine.sessions() as session:
        operation = await ActionStore().get(session, T, "PO-6:issue:v1")
    assert operation is not None and operation.state is State.PENDING  # it never happened
    harness.supplier.fail_with = []
    async with harness.engine.sessions() as session, session.begin():
        await harness.engine.resume(session, T, "PO-6", by="ops", reason="supplier is back")
    await harness.settle()
    assert (await harness.get("PO-6")).state == "complete"
    assert harness.supplier.orders == ["PO-6:issue:v1:g1"]


async def test_a_policy_refusal_goes_to_a_person_and_is_never_retried(harness: Harness) -> None:
    await harness.start("PO-7", amount=5, policy="forbidden")
    await harness.settle()
    record = await harness.get("PO-7")
    assert record.state == "human_review" and record.failure_class == "policy"
    assert record.review_from == "intake" and record.attempts == 0
    harness.clock.advance(10_000)
    assert await harness.engine.run_due() == 0  # nothing due: waiting for a person


async def test_a_failure_after_the_effect_compensates_it_then_fails(harness: Harness) -> None:
    await harness.start("PO-8", amount=5, fail_after_issue=True)
    await harness.settle()
    await harness.signal("PO-8", approves=APPROVED)
    await harness.settle()
    record = await harness.get("PO-8")
    assert record.state == "failed" and record.compensations == []
    assert harness.supplier.orders == ["PO-8:issue:v1:g1"]
    assert harness.supplier.cancelled == ["o-1"]
    kinds = [kind for kind, _, _ in await harness.kinds("PO-8")]
    assert kinds[-2:] == ["failure", "compensate"]


async def test_a_compensation_that_fails_goes_to_human_review_and_resumes(
    harness: Harness,
) -> None:
    harness.supplier.cancel_fails = True
    await harness.start("PO-9", amount=5, fail_after_issue=True)
    await harness.settle()
    await harness.signal("PO-9", approves=APPROVED)
    await harness.settle()
    record = await harness.get("PO-9")
    assert record.state == "human_review" and record.review_from == "compensating"
    assert "refuses to cancel" in (record.last_error or "")
    harness.supplier.cancel_fails = False
    # the compensation failed for good; resuming tries it again under a new key
    async with harness.engine.sessions() as session, session.begin():
        await harness.engine.resume(session, T, "PO-9", by="ops", reason="supplier fixed")
    await harness.settle()
    assert (await harness.get("PO-9")).state == "failed"
    assert harness.supplier.cancelled == ["o-1"]
    async with harness.engine.sessions() as session:
        history = await harness.engine.history(session, T, "PO-9")
    undo_keys = [step["key"] for h in history if h.kind == "compensate" for step in h.steps]
    assert undo_keys == ["PO-9:issue:v1:undo:r1"]


async def test_cancel_while_waiting_and_after_the_effect(harness: Harness) -> None:
    await harness.start("PO-10", amount=5)
    await harness.start("PO-11", amount=5, fail_after_issue=False)
    await harness.settle()
    await harness.signal("PO-11", approves=APPROVED)
    await harness.settle()
    async with harness.engine.sessions() as session, session.begin():
        await harness.engine.cancel(session, T, "PO-10", by="ops", reason="not needed")
        with pytest.raises(OperatorActionError):
            await harness.engine.cancel(session, T, "PO-11", by="ops", reason="too late")
    await harness.settle()
    assert (await harness.get("PO-10")).state == "cancelled"
    assert harness.supplier.orders == ["PO-11:issue:v1:g1"] and harness.supplier.cancelled == []


async def test_operators_escalate_and_resume(harness: Harness) -> None:
    await harness.start("PO-12", amount=5)
    await harness.settle()
    async with harness.engine.sessions() as session, session.begin():
        escalated = await harness.engine.escalate(session, T, "PO-12", by="ops", reason="look")
    assert escalated.state == "human_review" and escalated.review_from == "await_approval"
    async with harness.engine.sessions() as session, session.begin():
        with pytest.raises(OperatorActionError):
            await harness.engine.resume(session, T, "PO-12", by="ops", reason="x", to_state="zz")
        await harness.engine.resume(session, T, "PO-12", by="ops", reason="back")
    await harness.settle()
    record = await harness.get("PO-12")
    assert record.state == "await_approval" and record.wait is not None
    operators = [h for h in await harness.kinds("PO-12") if h[0] == "operator"]
    assert operators == [
        ("operator", "await_approval", "human_review"),
        ("operator", "human_review", "await_approval"),
    ]


async def test_secrets_and_named_personal_fields_stay_out_of_the_history(
    harness: Harness,
) -> None:
    await harness.start("PO-13", amount=5, api_token="s3cr3t", card_number="4111")
    await harness.settle()
    async with harness.engine.sessions() as session:
        history = await harness.engine.history(session, T, "PO-13")
    stored = json.dumps([h.to_json() for h in history])
    assert "s3cr3t" not in stored and "4111" not in stored
    assert (await harness.get("PO-13")).data["input"]["api_token"] == "s3cr3t"


async def test_credentials_and_exception_messages_stay_out_of_every_workflow_output(
    harness: Harness,
) -> None:
    """private_key and passphrase (any spelling) and a handler's exception message reach no
    history record, no published event, no last_error and neither form of ``workflows show``."""
    canaries = ["PK-CANARY-1", "PASS-CANARY-2", "API-CANARY-3", "ERR-SECRET-8888"]
    await harness.start(
        "PO-14",
        amount=5,
        private_key="PK-CANARY-1",
        **{"Pass-Phrase": "PASS-CANARY-2", "apiKey": "API-CANARY-3"},
        explode=True,
    )
    await harness.engine.run_due()
    record = await harness.get("PO-14")
    assert record.failure_class == "transient" and record.last_error is not None
    async with harness.engine.sessions() as session:
        history = await harness.engine.history(session, T, "PO-14")
        payloads = (await session.execute(text("SELECT payload FROM outbox_events"))).scalars()
        published = b" ".join(payloads).decode()
        now_ms = int(harness.clock() * 1000)
        report = await ops_workflows.describe(session, T, "PO-14", now_ms=now_ms)
    assert report is not None
    outputs = {
        "last_error": record.last_error,
        "history": json.dumps([h.to_json() for h in history]),
        "events": published,
        "show --json": json.dumps(report.to_json()),
        "show": "\n".join(cli_workflows._report_lines(report)),
    }
    leaks = {(where, c) for where, text_ in outputs.items() for c in canaries if c in text_}
    assert leaks == set()
    assert "ValueError raised at test_engine.py:" in record.last_error
