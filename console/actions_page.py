"""Agent actions: the UNKNOWN queue, the longest UNKNOWN first; resolve one (succeeded or
failed with a reason) through :func:`outboxkit.ops.actions.resolve_operation`, as
``outboxkit actions resolve``; audited in the ledger's trail and in the console's.

Below it, the tool calls waiting for a person's approval (:func:`outboxkit.ops.approvals.
waiting_approvals`, as ``outboxkit actions approvals``), oldest first, paged by keyset, with
their expiry; their arguments only for those who may see payloads (operators), the hash for
everyone. The console does not decide them: the run's own process does, through
:func:`outboxkit.agents.approvals.decide`."""

from __future__ import annotations

from outboxkit.actions.errors import ActionError
from outboxkit.actions.records import Resolution
from outboxkit.console.context import (
    console_of,
    keyset_of,
    reason_of,
    require_tenant,
    tenants_of,
    text_of,
)
from outboxkit.ops.actions import resolve_operation, resolving_store, unknown_queue
from outboxkit.ops.approvals import waiting_approvals
from outboxkit.outbox.clock import read_db_now_ms
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

RESOLUTIONS = {"succeeded": Resolution.SUCCEEDED, "failed": Resolution.FAILED}


async def queue_page(request: Request) -> Response:
    """The UNKNOWN operations and the approvals waiting (of the principal's tenants)."""
    console = console_of(request)
    query = request.query_params
    tenant, allowed = tenants_of(request, text_of(query, "tenant"))
    size = console.config.page_size
    async with AsyncSession(console.engine) as session:
        operations = await unknown_queue(session, tenant=tenant, limit=size, tenants=allowed)
        now = await read_db_now_ms(session)
        waiting = await waiting_approvals(
            session,
            now_ms=now,
            tenant=tenant,
            tenants=allowed,
            limit=size,
            after=keyset_of(query, "approvals_after"),
        )
    with_args = request.state.principal.may_act
    next_approvals: dict[str, str] | None = None
    if len(waiting) == size:
        next_approvals = {"tenant": tenant} if tenant else {}
        next_approvals["approvals_after"] = waiting[-1].keyset
    return console.render(
        request,
        "actions.html",
        operations=operations,
        now=now,
        tenant=tenant,
        approvals=[approval.shown(with_args=with_args) for approval in waiting],
        with_args=with_args,
        next_approvals=next_approvals,
    )


async def resolve_action(request: Request) -> Response:
    """Resolve one operation: SUCCEEDED or FAILED_FINAL, with the operator's reason."""
    console = console_of(request)
    principal, form = await console.change_form(request)
    tenant, key = text_of(form, "tenant"), text_of(form, "key")
    resolution = RESOLUTIONS.get(text_of(form, "resolution") or "")
    if tenant is None or key is None or resolution is None:
        raise HTTPException(400, "give the tenant, the key and succeeded or failed")
    require_tenant(request, tenant)
    reason = reason_of(form)
    try:
        store = resolving_store(console.config.actions_topic)
        async with AsyncSession(console.engine, expire_on_commit=False) as session:
            operation = await resolve_operation(
                session,
                store,
                tenant=tenant,
                key=key,
                resolution=resolution,
                by=principal.name,
                reason=reason,
                external_ref=text_of(form, "external_ref"),
            )
    except (ActionError, ValueError) as error:
        await console.audit(
            principal, action="actions.resolve", target=f"{tenant}/{key}",
            filter={"resolution": resolution.value}, count=0, reason=reason,
            outcome=f"refused: {error}",
        )  # fmt: skip
        raise HTTPException(409, str(error)) from None
    text = f"{operation.key} ({operation.tenant}): {operation.state}"
    await console.audit(
        principal,
        action="actions.resolve",
        target=f"{tenant}/{key}",
        filter={"resolution": resolution.value},
        count=1,
        reason=reason,
        outcome=text,
    )
    return console.render(request, "done.html", message=text, back="/actions")


routes = [
    Route("/actions", queue_page, methods=["GET"]),
    Route("/actions/resolve", resolve_action, methods=["POST"]),
]
