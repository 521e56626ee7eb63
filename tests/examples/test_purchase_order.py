"""Purchase order PO-2026-481 from request to issue (examples/purchase_order), as outcomes.

Every test counts what happened in the world: orders in the supplier's ERP, notifications
sent, history rows, signals and what became of them, outbox rows. The services are real HTTP
servers on loopback; the database is real PostgreSQL (SQLite too where ``db_url`` is used);
the end-to-end test runs through real Kafka. Days of waiting pass on the business clock the
engine and the supplier share.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from outboxkit.actions import ActionStore, State
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay, RelayOptions
from outboxkit.testing.kafka import create_topic
from outboxkit.workflows import Status, WorkflowWorker, request_hash
from outboxkit.workflows.events import REMINDER, TIMER, TRANSITIONED

from examples.purchase_order.definition import DAY_S, issue_key
from examples.purchase_order.sample import PO_2026_481, TENANT
from examples.purchase_order.supplier import Fault
from examples.purchase_order.validation import POLICY, normalise, validate
from tests.support import REPO
from tests.support.consumers import alive, produce_events, running
from tests.support.kafka import read_topic, wait_for
from tests.support.purchase_order import PO, Harness, decode_row, purchase_orders
from tests.support.waits import scaled

KEY = "PO-2026-481:issue:v1"
TOTAL = 40 * 2_450 + 6 * 8_990
FAST_RELAY = RelayOptions(lease_ttl_s=5.0, request_timeout_s=2.0, poll_interval_s=0.2)


def kinds(history: list) -> list[tuple[str, str | None, str]]:
    """(kind, from, to) of each history record."""
    return [(h.kind, h.from_state, h.to_state) for h in history]


async def to_approval(po: Harness, **start: object) -> None:
    """Start PO-2026-481 and run it until it waits for its approval."""
    await po.start(**start)  # type: ignore[arg-type]
    await po.tick()
    record = await po.get()
    assert (record.state, record.status) == ("await_approval", Status.WAITING)


async def issue_count(po: Harness) -> int:
    """How many POST /orders the supplier received (replays and refusals included)."""
    return po.supplier.requests.count("POST /orders")


# -- the happy path, end to end through Kafka ------------------------------------------------


async def test_a_duplicate_approval_through_kafka_resumes_the_workflow_once(
    pg_url: str, kafka_bootstrap: str
) -> None:
    """Relay, the engine's consumer and a worker run in-process; the approver's event is
    delivered twice through Kafka. The inbox skips the redelivery: one resume, one consumed
    signal, one order, one notification; every history record is published once."""
    suffix = uuid.uuid4().hex[:8]
    events, signals = f"po-events-{suffix}", f"po-signals-{suffix}"
    for topic in (events, signals):
        await create_topic(kafka_bootstrap, topic)
    kafka = KafkaSettings(bootstrap=kafka_bootstrap)
    options = {"events_topic": events, "signals_topic": signals, "clock": time.time}
    async with purchase_orders(pg_url, **options) as po:
        relay = Relay(db_url=pg_url, kafka=kafka, options=FAST_RELAY)
        worker = WorkflowWorker(po.engine, poll_interval_s=0.2)
        app = po.engine.consumer_app("po-signals", retention_interval_s=None)
        async with relay, worker, running(app, pg_url, kafka_bootstrap) as (runtime, task):
            await po.start()
            waiting = await wait_for(
                po.get, lambda r: r.status is Status.WAITING, 60, "the approval wait"
            )
            assert waiting.state == "await_approval"
            approval = await po.approval(event_id="approval-po-2026-481")
            await produce_events(kafka_bootstrap, signals, [approval, approval])
            done = await wait_for(
                lambda: alive(task) or po.get(), lambda r: r.terminal, 60, "the workflow's end"
            )
            await wait_for(lambda: runtime.stats.received, lambda n: n >= 2, 60, "redelivery")
            history = await po.history()
            published = await read_topic(kafka_bootstrap, events, expected=len(history))
        assert runtime.stats.applied == 1 and runtime.stats.duplicates == 1
    assert done.state == "complete"
    assert done.data["order"]["id"] == "SO-000001"
    assert [(s.event_id, s.outcome) for s in await po.signals()] == [
        ("approval-po-2026-481", "consumed")
    ]
    assert [h.kind for h in history].count("resume") == 1
    assert [h.to_state for h in history if h.kind in ("start", "transition", "resume")] == [
        "intake",
        "validate",
        "plan",
        "await_approval",
        "authorize",
        "execute",
        "reconcile",
        "notify",
    ]
    assert history[-1].kind == "complete" and history[-1].result["order"] == "SO-000001"
    assert len(po.supplier.orders()) == 1 and po.supplier.orders()[0]["idempotency_key"] == (
        f"{KEY}:g1"
    )
    assert len(po.notifier.sent()) == 1
    transitioned = [
        dict(r.headers)["ce_id"].decode()
        for r in published
        if dict(r.headers)["ce_type"].decode() == TRANSITIONED
    ]
    assert transitioned == [f"{TENANT}/{PO}/{h.seq}" for h in history]


# -- validation ------------------------------------------------------------------------------


def invalid(**changes: object) -> dict:
    return {**PO_2026_481, **changes}


INVALID = {
    "PO-BAD-1": (invalid(cost_centre="CC-9999-XX"), "cost centre 'CC-9999-XX' is not one of"),
    "PO-BAD-2": (invalid(supplier="SUP-0099"), "supplier 'SUP-0099' is blocked"),
    "PO-BAD-3": (invalid(currency="USD"), "currency 'USD' is not allowed"),
    "PO-BAD-4": (invalid(items=[{"sku": "GOLD-BAR", "qty": 1}]), "GOLD-BAR is not in the"),
    "PO-BAD-5": (invalid(tenant="globex"), "tenant 'globex' is not the workflow's tenant"),
    "PO-BAD-6": (invalid(supplier="SUP-7777"), "supplier 'SUP-7777' is unknown to the ERP"),
    "PO-BAD-7": (invalid(items=[{"sku": "TONER-K-XL", "qty": 0}]), "quantity must be 1 to"),
    "PO-BAD-8": (invalid(cost_centre=None), "missing cost_centre"),
}


async def test_an_invalid_request_ends_rejected_with_its_reason_and_orders_nothing(
    db_url: str,
) -> None:
    async with purchase_orders(db_url) as po:
        for workflow_id, (request, _) in INVALID.items():
            await po.start({**request, "po": workflow_id}, workflow_id=workflow_id)
        await po.tick()
        for workflow_id, (_, reason) in INVALID.items():
            record = await po.get(workflow_id)
            history = await po.history(workflow_id)
            assert (record.state, record.status) == ("rejected", Status.DONE), workflow_id
            assert any(reason in text for text in history[-1].decision["reason"]), workflow_id
            assert history[-1].to_state == "rejected" and len(history) <= 3
    assert po.supplier.orders() == [] and po.supplier.quotes() == []
    assert "POST /quotes" not in po.supplier.requests


def test_validation_names_each_field_it_refuses() -> None:
    supplier = {"status": "active", "currency": "EUR", "catalogue": {"PAPER-A4-80G": 1}}
    request, problems = normalise(PO_2026_481)
    assert problems == []
    request["items"] = [{"sku": "PAPER-A4-80G", "qty": 2}]
    assert validate(request, tenant=TENANT, supplier=supplier) == []
    assert validate(request, tenant="globex", supplier=supplier) == [
        "tenant 'acme' is not the workflow's tenant 'globex'",
        "tenant 'globex' has no purchasing policy",
    ]
    twice = {**request, "items": request["items"] * 2}
    assert validate(twice, tenant=TENANT, supplier=supplier) == [
        "line 2: PAPER-A4-80G appears twice"
    ]
    assert validate({**request, "items": []}, tenant=TENANT, supplier=supplier) == ["no items"]
    assert normalise("PO please")[1] == ["the request is not an object"]
    assert set(POLICY) == {TENANT}


# -- the quote, the approval, the wait -------------------------------------------------------


async def test_the_plan_gets_a_price_quote_with_an_expiry_and_the_wait_shows_it(
    pg_url: str,
) -> None:
    async with purchase_orders(pg_url, quote_ttl_s=5 * DAY_S) as po:
        await to_approval(po)
        [quote] = po.supplier.quotes()
        assert (quote["id"], quote["total_cents"], quote["status"]) == ("Q-0001", TOTAL, "valid")
        assert quote["expires_at"] == pytest.approx(po.clock() + 5 * DAY_S)
        history = await po.history()
        [plan] = [h for h in history if h.from_state == "plan"]
        [step] = plan.steps
        assert (step["key"], step["executed"]) == ("PO-2026-481:quote:1", True)
        assert plan.decision == {
            "quote": "Q-0001",
            "total_cents": TOTAL,
            "expires_at": quote["expires_at"],
        }
        preview = await po.preview()
        assert preview == {
            "po": PO,
            "tenant": TENANT,
            "supplier": "SUP-0042",
            "cost_centre": "CC-4100-IT",
            "currency": "EUR",
            "items": [
                {"sku": "PAPER-A4-80G", "qty": 40, "unit_price_cents": 2_450},
                {"sku": "TONER-K-XL", "qty": 6, "unit_price_cents": 8_990},
            ],
            "total_cents": TOTAL,
            "quote_id": "Q-0001",
            "quote_version": 1,
        }
        assert (await po.get()).wait.request_hash == request_hash(preview)
        assert history[-1].decision["awaiting_approval_of"] == request_hash(preview)
        # the requester's address is personal data: kept out of the history
        assert "maria.keller" not in str([h.data for h in history])


async def test_an_approval_of_another_preview_is_rejected_and_the_wait_goes_on(
    pg_url: str,
) -> None:
    async with purchase_orders(pg_url) as po:
        await to_approval(po)
        shown = await po.preview()
        cheaper = {**shown, "total_cents": shown["total_cents"] - 10_000}
        other = await po.deliver(await po.approval(preview=cheaper, event_id="a-other"))
        forged = await po.deliver(await po.approval(key=b"not-the-key", event_id="a-forged"))
        assert (other.outcome, other.reason) == (
            "rejected",
            "it approves another request than the one awaiting approval",
        )
        assert (forged.outcome, forged.reason) == ("rejected", "not authenticated")
        assert await po.tick() == 0
        record = await po.get()
        assert (record.state, record.status, record.approval) == (
            "await_approval",
            Status.WAITING,
            None,
        )
        assert po.supplier.orders() == []

        right = await po.approve(event_id="a-right")
        assert right.outcome == "accepted"
        done = await po.get()
        assert done.state == "complete" and done.approval.request_hash == request_hash(shown)
        assert [(s.event_id, s.outcome) for s in await po.signals()] == [
            ("a-other", "rejected"),
            ("a-forged", "rejected"),
            ("a-right", "consumed"),
        ]
        [resume] = [h for h in await po.history() if h.kind == "resume"]
        assert resume.approval_ref == "approvals/a-right"
        assert len(po.supplier.orders()) == 1


async def test_two_days_of_waiting_with_a_reminder_each_day_then_the_approval(
    pg_url: str,
) -> None:
    """No process is held while waiting: the deadline and the reminders are outbox rows with
    ``deliver_at``; the engine's consumer takes each back when the relay delivers it."""
    async with purchase_orders(pg_url) as po:
        await to_approval(po)
        began = po.clock()
        timers = await po.outbox_rows(TIMER)
        assert [(decode_row(r).get_data()["kind"], r["deliver_at_ms"]) for r in timers] == [
            ("deadline", int((began + 3 * DAY_S) * 1000)),
            ("reminder", int((began + DAY_S) * 1000)),
        ]
        for day in (1, 2):
            po.clock.advance(DAY_S)
            due = [
                r for r in await po.outbox_rows(TIMER) if r["deliver_at_ms"] <= po.clock() * 1000
            ]
            reminder = decode_row(due[-1])
            assert reminder.get_data() == {"kind": "reminder", "number": day}
            signal = await po.deliver(reminder)
            assert (signal.outcome, signal.reason) == ("timer", f"reminder {day} published")
            assert await po.tick() == 0  # a reminder wakes nobody
        reminders = await po.outbox_rows(REMINDER)
        assert [decode_row(r).get_data()["number"] for r in reminders] == [1, 2]
        # the third would fall on the deadline: none is scheduled
        assert len(await po.outbox_rows(TIMER)) == 3
        assert (await po.get()).status is Status.WAITING

        po.clock.advance(3600)
        await po.approve()
        record = await po.get()
        assert record.state == "complete"
        [wait] = [h for h in await po.history() if h.kind == "wait"]
        [resume] = [h for h in await po.history() if h.kind == "resume"]
        assert resume.at_ms - wait.at_ms == int((2 * DAY_S + 3600) * 1000)
        assert len(po.supplier.orders()) == 1 and len(po.notifier.sent()) == 1


async def test_no_answer_in_three_days_hands_the_order_to_a_person(pg_url: str) -> None:
    async with purchase_orders(pg_url) as po:
        await to_approval(po)
        po.clock.advance(3 * DAY_S - 1)
        assert await po.tick() == 0
        po.clock.advance(1)
        await po.tick()
        record = await po.get()
        assert (record.state, record.status, record.review_from) == (
            "human_review",
            Status.WAITING,
            "await_approval",
        )
        assert kinds(await po.history())[-1] == ("deadline", "await_approval", "human_review")
        assert po.supplier.orders() == [] and po.notifier.sent() == []


# -- re-validation ---------------------------------------------------------------------------


async def test_an_approval_after_the_price_expired_needs_a_new_quote_and_a_new_approval(
    pg_url: str,
) -> None:
    """The quote is valid one day; the approval comes on day two. The re-check on resume asks
    the supplier, finds the price expired and goes to needs_quote: the approval is dropped, a
    new quote is asked for, and only an approval of the new preview issues the order."""
    async with purchase_orders(pg_url, quote_ttl_s=DAY_S) as po:
        await to_approval(po)
        first = await po.preview()
        po.clock.advance(2 * DAY_S)
        assert (await po.approve(event_id="a-old")).outcome == "accepted"
        record = await po.get()
        assert (record.state, record.status, record.approval) == (
            "await_approval",
            Status.WAITING,
            None,
        )
        history = await po.history()
        [resume] = [h for h in history if h.kind == "resume"]
        assert (resume.to_state, resume.decision) == (
            "needs_quote",
            {"recheck": "quote_still_valid", "to": "needs_quote"},
        )
        assert resume.observations[0]["value"]["status"] == "expired"
        assert [h.to_state for h in history[-3:]] == ["plan", "await_approval", "await_approval"]
        second = await po.preview()
        assert (first["quote_id"], second["quote_id"]) == ("Q-0001", "Q-0002")
        assert po.supplier.orders() == []

        stale = await po.deliver(await po.approval(preview=first, event_id="a-again"))
        assert stale.outcome == "rejected"  # the old preview is not what waits now
        await po.approve(event_id="a-new")
        assert (await po.get()).state == "complete"
        [order] = po.supplier.orders()
        assert order["quote_id"] == "Q-0002" and order["idempotency_key"] == f"{KEY}:g1"
        assert [(s.event_id, s.outcome) for s in await po.signals()] == [
            ("a-old", "consumed"),
            ("a-again", "rejected"),
            ("a-new", "consumed"),
        ]


async def test_a_price_that_expires_after_the_approval_goes_back_to_needs_quote(
    pg_url: str,
) -> None:
    """The approval resumes the wait with a valid price; the supplier withdraws it before the
    order goes out. authorize re-validates, finds it expired: needs_quote, no order."""
    async with purchase_orders(pg_url) as po:
        await to_approval(po)
        await po.deliver(await po.approval())
        assert await po.engine.run_due() == 1  # the resume: the re-check still sees it valid
        assert (await po.get()).state == "authorize"
        po.supplier.expire_quote("Q-0001")
        await po.tick()
        assert (await po.get()).state == "await_approval"
        steps = kinds(await po.history())
        assert steps[-5:] == [
            ("resume", "await_approval", "authorize"),
            ("transition", "authorize", "needs_quote"),
            ("transition", "needs_quote", "plan"),
            ("transition", "plan", "await_approval"),
            ("wait", "await_approval", "await_approval"),
        ]
        assert await issue_count(po) == 0
        await po.approve()
        assert (await po.get()).state == "complete"
        assert [o["quote_id"] for o in po.supplier.orders()] == ["Q-0002"]


async def test_a_quote_changed_after_the_approval_is_approved_again_before_the_order(
    pg_url: str,
) -> None:
    """The supplier revises the quote (the record changed) after the approval: the preview as
    it is now has another hash, so the approval does not cover it and the workflow waits for
    a new one; the order carries the revised total."""
    async with purchase_orders(pg_url) as po:
        await to_approval(po)
        await po.deliver(await po.approval(event_id="a-1"))
        assert await po.engine.run_due() == 1
        po.supplier.change_quote("Q-0001", surcharge_cents=2_500)
        await po.tick()
        record = await po.get()
        assert (record.state, record.status, record.approval) == (
            "await_approval",
            Status.WAITING,
            None,
        )
        stale = [h for h in await po.history() if h.kind == "approval_stale"]
        assert [(h.from_state, h.to_state) for h in stale] == [("authorize", "await_approval")]
        revised = await po.preview()
        assert (revised["total_cents"], revised["quote_version"]) == (TOTAL + 2_500, 2)
        assert await issue_count(po) == 0
        await po.approve(event_id="a-2")
        [order] = po.supplier.orders()
        assert order["total_cents"] == TOTAL + 2_500


# -- exactly one order -----------------------------------------------------------------------


async def test_exactly_one_order_when_the_worker_stops_after_the_supplier_committed(
    pg_url: str,
) -> None:
    """The worker is stopped mid-call (its task cancelled, as a shutdown does) while the
    supplier holds the reply of the committed order; nothing of its run is recorded, and its
    claim on the instance runs out. The state runs again on the next worker: the issue effect
    is reconciled by its key, not re-sent."""
    async with purchase_orders(pg_url) as po:
        po.engine.lease_s = 2.0  # the dead worker's claim runs out quickly
        await to_approval(po)
        await po.deliver(await po.approval())
        await po.engine.run_due()  # resume
        await po.engine.run_due()  # authorize
        assert (await po.get()).state == "execute"
        hold = po.supplier.inject(Fault.HOLD_AFTER_COMMIT)
        worker = asyncio.create_task(po.engine.run_due())
        await wait_for(hold.reached.is_set, bool, 30, "the order committed at the supplier")
        worker.cancel()  # stopped before the reply
        with pytest.raises(asyncio.CancelledError):
            await worker
        hold.release()
        assert (await po.get()).state == "execute"  # nothing of the run was recorded

        await wait_for(po.tick, bool, 30, "another worker to claim the instance")
        await po.tick()
        assert (await po.get()).state == "complete"
        [execute] = [h for h in await po.history() if h.from_state == "execute"]
        assert [(s["key"], s["executed"]) for s in execute.steps] == [(KEY, False)]
        async with po.sessions() as session:
            operation = await ActionStore().get(session, TENANT, KEY)
        assert operation.state is State.SUCCEEDED and operation.external_ref == "SO-000001"
    assert len(po.supplier.orders()) == 1 and await issue_count(po) == 1
    assert issue_key(PO) == KEY


async def test_a_gateway_timeout_is_followed_by_a_query_by_key_before_any_retry(
    pg_url: str,
) -> None:
    """The supplier commits the order, then its gateway answers 504: the effect is UNKNOWN.
    The next run asks the supplier for the order by its key first, finds it, and goes on."""
    async with purchase_orders(pg_url) as po:
        await to_approval(po)
        po.supplier.inject(Fault.GATEWAY_TIMEOUT_AFTER_COMMIT)
        await po.approve()
        record = await po.get()
        assert (record.state, record.failure_class, record.open_unknown) == (
            "execute",
            "unknown_outcome",
            KEY,
        )
        async with po.sessions() as session:
            assert (await ActionStore().get(session, TENANT, KEY)).state is State.UNKNOWN
        assert len(po.supplier.orders()) == 1
        calls = len(po.supplier.requests)

        po.clock.advance(60)  # past the state's backoff
        await po.tick()
        assert (await po.get()).state == "complete"
        # first the lookup by key (the reconciler), then reconcile reads the order back:
        # the order is never sent again
        assert po.supplier.requests[calls:] == ["GET /orders", "GET /orders/SO-000001"]
        [execute] = [h for h in await po.history() if h.from_state == "execute"]
        assert [(s["key"], s["executed"], s["external_ref"]) for s in execute.steps] == [
            (KEY, False, "SO-000001")
        ]
        async with po.sessions() as session:
            operation = await ActionStore().get(session, TENANT, KEY)
        assert operation.state is State.SUCCEEDED
    assert len(po.supplier.orders()) == 1 and await issue_count(po) == 1


# -- the notification, the cancel ------------------------------------------------------------


async def test_the_notification_is_retried_alone(pg_url: str) -> None:
    """The notifier answers 503 twice, then sends: the notify effect is retried by itself;
    the order is neither re-issued nor asked for again."""
    async with purchase_orders(pg_url) as po:
        await to_approval(po)
        po.notifier.fail_next(2)
        await po.approve()
        assert (await po.get()).state == "complete"
        async with po.sessions() as session:
            notify = await ActionStore().get(session, TENANT, "PO-2026-481:notify:v1")
            issue = await ActionStore().get(session, TENANT, KEY)
        assert (notify.state, notify.attempts) == (State.SUCCEEDED, 3)
        assert (issue.state, issue.attempts) == (State.SUCCEEDED, 1)
    assert po.notifier.attempts == 3 and len(po.notifier.sent()) == 1
    assert len(po.supplier.orders()) == 1 and await issue_count(po) == 1
    [notification] = po.notifier.sent()
    assert notification["subject"] == "PO-2026-481 issued as SO-000001"
    assert notification["recipient"] == "maria.keller@acme.example"
    [step] = (await po.history())[-1].steps  # the address stays out of the history
    assert (step["key"], step["result"]["recipient"]) == ("PO-2026-481:notify:v1", "[redacted]")


async def test_a_cancel_after_the_issue_cancels_the_order_at_the_supplier(pg_url: str) -> None:
    """Cancelled once the order is out: the registered compensation cancel_order runs as a
    keyed step of its own; the history keeps the effect and its compensation."""
    async with purchase_orders(pg_url) as po:
        await to_approval(po)
        await po.deliver(await po.approval())
        for _ in range(3):  # resume, authorize, execute
            await po.engine.run_due()
        record = await po.get()
        assert record.state == "reconcile"
        assert [(c.name, c.effect_key) for c in record.compensations] == [("cancel_order", KEY)]
        async with po.sessions() as session, session.begin():
            await po.engine.cancel(session, TENANT, PO, by="maria", reason="budget frozen")
        await po.tick()
        record = await po.get()
        assert (record.state, record.status, record.compensations) == (
            "cancelled",
            Status.DONE,
            [],
        )
        history = await po.history()
        [issued] = [h for h in history if h.from_state == "execute"]
        assert [(s["key"], s["executed"]) for s in issued.steps] == [(KEY, True)]
        assert kinds(history)[-2:] == [
            ("cancel", "reconcile", "compensating"),
            ("compensate", "compensating", "cancelled"),
        ]
        compensate = history[-1]
        assert compensate.decision == {
            "compensated": KEY,
            "with": "cancel_order",
            "authorised_by": "procurement",
        }
        assert [(s["key"], s["executed"]) for s in compensate.steps] == [(f"{KEY}:undo", True)]
    [order] = po.supplier.orders()
    assert order["status"] == "cancelled" and await issue_count(po) == 1
    assert "POST /orders/SO-000001/cancel" in po.supplier.requests
    assert po.notifier.sent() == []  # cancelled before the notification


# -- versions and the demo -------------------------------------------------------------------


async def test_an_instance_started_on_version_1_finishes_on_version_1(pg_url: str) -> None:
    async with purchase_orders(pg_url) as po:
        po.use_versions(1)  # before the deploy
        await to_approval(po)
        approval = await po.approval()
        po.use_versions(1, 2)  # deployed: v2 is current, v1 kept for running instances
        await po.deliver(approval)
        await po.tick()
        record = await po.get()
        assert (record.version, record.state) == (1, "complete")
        assert {h.version for h in await po.history()} == {1}
        assert [h.to_state for h in await po.history()][-2:] == ["execute", "complete"]
        assert po.notifier.sent() == []  # version 1 did not notify
        await po.start(workflow_id="PO-2026-482")
        assert (await po.get("PO-2026-482")).version == 2


async def test_the_demo_tells_the_story_and_ends_with_one_order(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env["OUTBOXKIT_DB_URL"] = f"sqlite:///{tmp_path / 'demo.db'}"
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "examples.purchase_order"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(180),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "orders at the supplier: 1 (key PO-2026-481:issue:v1)" in result.stdout
    assert "notifications sent: 1" in result.stdout
