"""Workflows: instances by state, name and age (or stuck for a while); an instance's page with
what :func:`outboxkit.ops.workflows.describe` reports; and cancel, resume and escalate through
the application's engine (``--app``), as ``outboxkit workflows`` does."""

from __future__ import annotations

from outboxkit.console.context import (
    console_of,
    keyset_of,
    reason_of,
    require_tenant,
    tenants_of,
    text_of,
)
from outboxkit.ops import workflows as ops
from outboxkit.outbox.clock import read_db_now_ms
from outboxkit.workflows import WorkflowError
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

DECISIONS = ("resume", "cancel", "escalate")


def _stuck_ms(text: str | None) -> int | None:
    if text is None:
        return None
    units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    number, unit = text[:-1], text[-1:]
    if unit not in units or not number.isdigit():
        raise HTTPException(400, "stuck_after is a number and s, m, h or d: 10m")
    return int(number) * units[unit]


async def list_page(request: Request) -> Response:
    """Instances, most recently changed first, paged by keyset on ``(updated_ms, id)`` (stuck
    ones: oldest due first, paged on ``(due_ms, id)``)."""
    console = console_of(request)
    query = request.query_params
    state, name = text_of(query, "state"), text_of(query, "name")
    tenant, allowed = tenants_of(request, text_of(query, "tenant"))
    stuck_after = text_of(query, "stuck_after")
    stuck = stuck_after is not None
    size = console.config.page_size
    async with AsyncSession(console.engine) as session:
        now = await read_db_now_ms(session)
        records = await ops.list_workflows(
            session,
            now_ms=now,
            tenant=tenant,
            name=name,
            states=[state] if state else [],
            stuck_after_ms=_stuck_ms(stuck_after),
            limit=size,
            tenants=allowed,
            before=None if stuck else keyset_of(query, "before"),
            after=keyset_of(query, "after") if stuck else None,
        )
    rows = [ops.summary(record, now) for record in records]
    last = records[-1] if len(records) == size else None
    filters = (("state", state), ("name", name), ("tenant", tenant), ("stuck_after", stuck_after))
    more = {k: v for k, v in filters if v}
    if last is not None:
        more["after" if stuck else "before"] = ops.page_keyset(last, stuck=stuck)
    return console.render(
        request,
        "workflows.html",
        rows=rows,
        now=now,
        state=state,
        name=name,
        tenant=tenant,
        stuck_after=stuck_after,
        age_text=ops.age_text,
        next_query=more if last is not None else None,
    )


async def instance_page(request: Request) -> Response:
    """One instance."""
    console = console_of(request)
    tenant, workflow_id = request.path_params["tenant"], request.path_params["workflow_id"]
    require_tenant(request, tenant)
    async with AsyncSession(console.engine) as session:
        report = await ops.describe(
            session, tenant, workflow_id, now_ms=await read_db_now_ms(session)
        )
    if report is None:
        raise HTTPException(404, f"no workflow {workflow_id!r} of tenant {tenant!r}")
    return console.render(
        request,
        "workflow.html",
        report=report,
        document=report.to_json(),
        can_decide=console.config.workflow_engine is not None,
        decisions=DECISIONS,
    )


async def decide_action(request: Request) -> Response:
    """Resume, cancel or escalate through the application's engine."""
    console = console_of(request)
    principal, form = await console.change_form(request)
    tenant, workflow_id = request.path_params["tenant"], request.path_params["workflow_id"]
    require_tenant(request, tenant)
    decision = request.path_params["decision"]
    if decision not in DECISIONS:
        raise HTTPException(404, f"no decision {decision!r}")
    engine = console.workflow_engine()
    if engine is None:
        raise HTTPException(409, "the console was started without --app: workflows are read-only")
    reason = reason_of(form)
    by = principal.name
    to = text_of(form, "to")
    target = f"{tenant}/{workflow_id}"
    try:
        if decision == "resume":
            record = await ops.decide(
                engine,
                lambda s: engine.resume(s, tenant, workflow_id, by=by, reason=reason, to_state=to),
            )
        elif decision == "cancel":
            record = await ops.decide(
                engine, lambda s: engine.cancel(s, tenant, workflow_id, by=by, reason=reason)
            )
        else:
            record = await ops.decide(
                engine, lambda s: engine.escalate(s, tenant, workflow_id, by=by, reason=reason)
            )
    except WorkflowError as error:
        await console.audit(
            principal, action=f"workflows.{decision}", target=target, filter={"to": to},
            count=0, reason=reason, outcome=f"refused: {error}",
        )  # fmt: skip
        raise HTTPException(409, str(error)) from None
    text = f"{record.workflow_id} ({record.tenant}): {record.state} ({record.status.value})"
    await console.audit(
        principal,
        action=f"workflows.{decision}",
        target=target,
        filter={"to": to} if to else {},
        count=1,
        reason=reason,
        outcome=text,
    )
    return console.render(request, "done.html", message=text, back=f"/workflows/{target}")


routes = [
    Route("/workflows", list_page, methods=["GET"]),
    Route("/workflows/{tenant}/{workflow_id}", instance_page, methods=["GET"]),
    Route("/workflows/{tenant}/{workflow_id}/{decision}", decide_action, methods=["POST"]),
]
