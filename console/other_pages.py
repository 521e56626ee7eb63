"""The inbox look-up (through :func:`outboxkit.ops.inbox.lookup`) and the audit trail."""

from __future__ import annotations

from outboxkit.console import audit
from outboxkit.console.context import console_of, int_of, text_of
from outboxkit.ops.inbox import lookup
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


async def inbox_page(request: Request) -> Response:
    """Whether ``(source, id)`` was applied, when and by which consumers."""
    console = console_of(request)
    source, event_id = text_of(request.query_params, "source"), text_of(request.query_params, "id")
    applied = None
    if source is not None and event_id is not None:
        applied = await lookup(console.engine, source, event_id)
    return console.render(request, "inbox.html", source=source, event_id=event_id, applied=applied)


async def audit_page(request: Request) -> Response:
    """The console's audit trail, newest first, paged by keyset."""
    console = console_of(request)
    size = console.config.page_size
    action = text_of(request.query_params, "action")
    rows = await audit.recent(
        console.engine,
        limit=size,
        before_id=int_of(request.query_params, "before"),
        action=action,
    )
    before = rows[-1].id if len(rows) == size else None
    return console.render(request, "audit.html", rows=rows, before=before, action=action)


routes = [
    Route("/inbox", inbox_page, methods=["GET"]),
    Route("/audit", audit_page, methods=["GET"]),
]
