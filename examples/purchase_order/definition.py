"""The purchase order workflow, versions 1 and 2, on outboxkit's workflow engine.

Version 2 (current)::

    intake -> validate -> plan -> await_approval -> authorize -> execute -> reconcile -> notify
        -> complete

- ``validate`` checks tenant, cost centre, supplier, currency and items against the policy and
  the supplier's record (read with ``ctx.observe``); a failing request ends in ``rejected``,
  the reasons in its history;
- ``plan`` asks the supplier for a price quote (an effect, keyed per round) that expires;
- ``await_approval`` waits (no process held) for ``approval.granted`` or ``approval.rejected``
  from the ``approvals`` source, bound to the hash of a fixed preview (supplier, cost centre,
  currency, items, tenant, total, quote); a reminder is published every day, and after three
  days a person takes over (``human_review``). When an approval arrives, a re-check asks the
  supplier whether the quote is still valid: expired, it goes to ``needs_quote`` and the
  approval is dropped;
- ``authorize`` re-validates right before the order: the quote still valid (else
  ``needs_quote``), the supplier still active, and the approval still covering the preview as
  it is now (``ctx.require_approval``; a changed quote goes back to ``await_approval``);
- ``execute`` issues the order as ONE effect with key ``PO-2026-481:issue:v1`` and registers
  its compensation ``cancel_order``; a lost reply (a gateway timeout) is reconciled by looking
  the order up by its key before anything else;
- ``reconcile`` reads the order back from the supplier and compares it with the preview;
- ``notify`` tells the requester, as an effect of its own: retrying it never re-issues the
  order;
- ``needs_quote`` drops the stale quote and plans again: a new quote needs a new approval.

Version 1 is kept registered for the instances that started on it: no reminders (expired
after three days), no re-check on resume, and the order is the last step. New instances start
on version 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outboxkit.outbox.backoff import Backoff
from outboxkit.workflows import (
    Budget,
    CompensationContext,
    Complete,
    Goto,
    Next,
    PolicyError,
    Wait,
    Workflow,
    WorkflowContext,
)

from examples.purchase_order.notifier import NotifierClient
from examples.purchase_order.supplier_client import SupplierClient
from examples.purchase_order.validation import POLICY, TenantPolicy, normalise, validate

NAME = "purchase_order"
APPROVALS = "approvals"
"""The source allowed to approve (the engine's verifier holds its key)."""
GRANTED = "approval.granted"
REJECTED = "approval.rejected"
DAY_S = 24 * 3600.0
APPROVAL_DEADLINE_S = 3 * DAY_S
ISSUE = "supplier.issue_order"
QUOTE = "supplier.quote"
NOTIFY = "notify.order_issued"
CANCEL_ORDER = "cancel_order"
BUDGET = Budget(
    max_attempts=5, total_s=3600.0, step_timeout_s=30.0, backoff=Backoff(base_s=1.0, cap_s=60.0)
)


def issue_key(po_number: str) -> str:
    """The key of the one order of a purchase order: ``PO-2026-481:issue:v1``."""
    return f"{po_number}:issue:v1"


def preview(data: dict[str, Any]) -> dict[str, Any]:
    """What the approver sees and approves, fixed: its hash binds the approval."""
    po, quote = data["po"], data["quote"]
    return {
        "po": po["po"],
        "tenant": po["tenant"],
        "supplier": po["supplier"],
        "cost_centre": po["cost_centre"],
        "currency": quote["currency"],
        "items": [
            {"sku": line["sku"], "qty": line["qty"], "unit_price_cents": line["unit_price_cents"]}
            for line in quote["items"]
        ],
        "total_cents": quote["total_cents"],
        "quote_id": quote["id"],
        "quote_version": quote["version"],
    }


@dataclass(frozen=True)
class Services:
    """What the workflow's steps talk to."""

    supplier: SupplierClient
    notifier: NotifierClient
    policy: dict[str, TenantPolicy] | None = None


def definitions(services: Services) -> list[Workflow]:
    """Both versions of the workflow, to register together (v2 starts new instances)."""
    return [_build(services, version=1), _build(services, version=2)]


def _build(services: Services, *, version: int) -> Workflow:
    supplier, notifier = services.supplier, services.notifier
    policy = services.policy or dict(POLICY)
    wf = Workflow(
        NAME,
        version=version,
        budget=BUDGET,
        reconcilers={ISSUE: supplier.find_order, NOTIFY: notifier.find},
        versions={"policy": "purchasing-2026.1", "schema": "po-request/1"},
        redact_keys=("requester", "recipient"),
    )
    current = version >= 2

    @wf.state("intake")
    async def intake(ctx: WorkflowContext) -> Next:
        po, problems = normalise(ctx.input)
        if problems:
            return Goto("rejected", decision={"reason": problems})
        ctx.data["po"] = po
        ctx.data["quote_round"] = 1
        return Goto("validate", decision={"po": po["po"]})

    @wf.state("validate")
    async def check(ctx: WorkflowContext) -> Next:
        po = ctx.data["po"]
        record = await ctx.observe("supplier", lambda: supplier.supplier(po["supplier"]))
        problems = validate(po, tenant=ctx.tenant, supplier=record, policy=policy)
        if problems:
            return Goto("rejected", decision={"reason": problems})
        return Goto(
            "plan",
            decision={"validated": ["tenant", "cost_centre", "supplier", "currency", "items"]},
        )

    @wf.state("plan")
    async def plan(ctx: WorkflowContext) -> Next:
        po = ctx.data["po"]
        items = [{"sku": item["sku"], "qty": item["qty"]} for item in po["items"]]
        quote = await ctx.effect(
            QUOTE,
            key=f"{po['po']}:quote:{ctx.data['quote_round']}",
            params={"supplier": po["supplier"], "items": items},
            run=lambda key: supplier.request_quote(key, supplier=po["supplier"], items=items),
        )
        ctx.data["quote"] = _kept(quote)
        return Goto(
            "await_approval",
            decision={
                "quote": quote["id"],
                "total_cents": quote["total_cents"],
                "expires_at": quote["expires_at"],
            },
        )

    async def quote_still_valid(ctx: WorkflowContext) -> str | None:
        """On an approval: an expired quote is a new decision (needs_quote)."""
        if ctx.signal is None or ctx.signal.type != GRANTED:
            return None
        fresh = await ctx.observe("quote", lambda: supplier.get_quote(ctx.data["quote"]["id"]))
        return "needs_quote" if fresh["status"] != "valid" else None

    @wf.state("await_approval", rechecks=[quote_still_valid] if current else [])
    async def await_approval(ctx: WorkflowContext) -> Next:
        shown = preview(ctx.data)
        return Wait(
            on={GRANTED: "authorize", REJECTED: "rejected"},
            deadline_s=APPROVAL_DEADLINE_S,
            on_deadline="human_review" if current else "expired",
            sources=(APPROVALS,),
            remind_every_s=DAY_S if current else None,
            approval_for=shown,
            decision={"preview": shown, "correlation": ctx.correlation},
        )

    @wf.state("authorize")
    async def authorize(ctx: WorkflowContext) -> Next:
        po = ctx.data["po"]
        fresh = await ctx.observe("quote", lambda: supplier.get_quote(ctx.data["quote"]["id"]))
        if fresh["status"] != "valid":
            return Goto("needs_quote", decision={"reason": f"quote {fresh['id']} has expired"})
        record = await ctx.observe("supplier", lambda: supplier.supplier(po["supplier"]))
        problems = validate(po, tenant=ctx.tenant, supplier=record, policy=policy)
        if problems:
            return Goto("rejected", decision={"reason": problems})
        ctx.data["quote"] = _kept(fresh)
        approval = ctx.require_approval(preview(ctx.data))  # a changed quote: approve again
        signal = ctx.data.get("last_signal") or {}
        approver = (signal.get("data") or {}).get("by")
        return Goto(
            "execute",
            decision={
                "approval": approval.ref,
                "approved_by": approver,
                "preview_hash": approval.request_hash,
            },
        )

    @wf.state("execute")
    async def execute(ctx: WorkflowContext) -> Next:
        shown = preview(ctx.data)
        ctx.require_approval(shown)
        po = ctx.data["po"]
        key = issue_key(po["po"])
        order = {
            "po": po["po"],
            "tenant": po["tenant"],
            "cost_centre": po["cost_centre"],
            "supplier": po["supplier"],
            "currency": shown["currency"],
            "quote_id": shown["quote_id"],
            "items": [{"sku": line["sku"], "qty": line["qty"]} for line in shown["items"]],
            "total_cents": shown["total_cents"],
        }
        issued = await ctx.effect(
            ISSUE,
            key=key,
            params=order,
            run=lambda idempotency_key: supplier.issue_order(idempotency_key, order),
            reconciler=supplier.find_order,
        )
        ctx.compensate_with(CANCEL_ORDER, {"order_id": issued["id"]}, effect_key=key)
        ctx.data["order"] = {"id": issued["id"], "status": issued["status"]}
        if not current:
            return Complete(result=_summary(ctx.data))
        return Goto("reconcile", decision={"order": issued["id"]})

    async def reconcile(ctx: WorkflowContext) -> Next:
        order_id = ctx.data["order"]["id"]
        held = await ctx.observe("order", lambda: supplier.get_order(order_id))
        shown = preview(ctx.data)
        differences = [
            name
            for name in ("supplier", "currency", "quote_id", "total_cents")
            if held.get(name) != shown[name]
        ]
        if differences or held.get("status") != "open":
            raise PolicyError(
                f"order {order_id} at the supplier differs from the approved preview "
                f"({', '.join(differences) or held.get('status')}): a person decides"
            )
        return Goto("notify", decision={"order": order_id, "matches_preview": True})

    async def notify(ctx: WorkflowContext) -> Next:
        po, order = ctx.data["po"], ctx.data["order"]
        message = {
            "recipient": po["requester"],
            "subject": f"{po['po']} issued as {order['id']}",
            "po": po["po"],
            "order": order["id"],
            "total_cents": ctx.data["quote"]["total_cents"],
            "currency": ctx.data["quote"]["currency"],
        }
        sent = await ctx.effect(
            NOTIFY,
            key=f"{po['po']}:notify:v1",
            params=message,
            run=lambda idempotency_key: notifier.send(idempotency_key, message),
        )
        ctx.data["notification"] = sent["id"]
        return Complete(result=_summary(ctx.data))

    if current:  # version 1 ended with the order
        wf.state("reconcile")(reconcile)
        wf.state("notify")(notify)

    @wf.state("needs_quote")
    async def needs_quote(ctx: WorkflowContext) -> Next:
        stale = ctx.data.pop("quote", None)
        ctx.data["quote_round"] += 1
        return Goto(
            "plan",
            decision={"stale_quote": stale and stale["id"], "round": ctx.data["quote_round"]},
        )

    @wf.compensation(CANCEL_ORDER, authorised_by="procurement", reconciler=None)
    async def cancel_order(c: CompensationContext) -> Any:
        return await supplier.cancel_order(c.idempotency_key, c.params["order_id"])

    return wf


def _kept(quote: dict[str, Any]) -> dict[str, Any]:
    """The quote as the workflow keeps it (without the moment's ``status``)."""
    return {key: value for key, value in quote.items() if key != "status"}


def _summary(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "po": data["po"]["po"],
        "order": data["order"]["id"],
        "total_cents": data["quote"]["total_cents"],
        "currency": data["quote"]["currency"],
        "notification": data.get("notification"),
    }
