"""Outbox rows: pending, parked or scheduled, filtered and paged by keyset; requeue parked rows
(one, a filter, or all) with the count shown and confirmed first. Through
:mod:`outboxkit.ops.outbox_rows`, as ``outboxkit outbox``."""

from __future__ import annotations

from typing import Any

from outboxkit.console.context import console_of, int_of, keyset_of, reason_of, text_of
from outboxkit.ops.outbox_rows import (
    RequeueRefused,
    RowFilter,
    Which,
    count_rows,
    list_rows,
    requeue,
    requeue_all_parked,
    requeue_matching,
    sort_key,
)
from starlette.datastructures import FormData, QueryParams
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

WHICH: tuple[Which, ...] = ("pending", "parked", "scheduled")
COUNT_CAP = 10_000
"""A list page counts its rows up to this many (the overview has the exact numbers)."""


def _which(values: QueryParams | FormData) -> Which:
    text = text_of(values, "which") or "pending"
    for which in WHICH:
        if which == text:
            return which
    raise HTTPException(400, "which is pending, parked or scheduled")


def _filter(values: QueryParams | FormData) -> RowFilter:
    return RowFilter(
        topic=text_of(values, "topic"),
        type=text_of(values, "type"),
        source=text_of(values, "source"),
    )


async def rows_page(request: Request) -> Response:
    """A page of rows."""
    console = console_of(request)
    query = request.query_params
    which = _which(query)
    wanted = _filter(query)
    size = console.config.page_size
    paged = RowFilter(wanted.topic, wanted.type, wanted.source, keyset_of(query, "after"))
    rows, now = await list_rows(console.engine, which=which, limit=size, wanted=paged)
    total = await count_rows(console.engine, which=which, wanted=wanted, at_most=COUNT_CAP)
    after = None
    if len(rows) == size:
        value, last = sort_key(which, rows[-1])
        after = f"{value}.{last}"
    return console.render(
        request,
        "outbox.html",
        which=which,
        rows=rows,
        now=now,
        total=f"{total:,}" + ("+" if total >= COUNT_CAP else ""),
        after=after,
        wanted=wanted,
        filters={k: v for k, v in _filters_of(wanted).items() if v},
    )


def _filters_of(wanted: RowFilter) -> dict[str, Any]:
    return {"topic": wanted.topic, "type": wanted.type, "source": wanted.source}


async def requeue_action(request: Request) -> Response:
    """Requeue parked rows: ``step=count`` shows how many; ``step=confirm`` with the count
    shown does it and records it in the audit trail."""
    console = console_of(request)
    principal, form = await console.change_form(request)
    scope = text_of(form, "scope") or "one"
    wanted = _filter(form)
    row_id = int_of(form, "id")
    if scope == "one" and row_id is None:
        raise HTTPException(400, "give the id of a parked row")
    if scope == "one":
        count = 1  # requeue refuses it, and says why, if it is not parked
    elif scope == "filter":
        count = await count_rows(console.engine, which="parked", wanted=wanted)
    elif scope == "all":
        count = await count_rows(console.engine, which="parked")
    else:
        raise HTTPException(400, "scope is one, filter or all")
    described = {"scope": scope, "id": row_id, **_filters_of(wanted)}
    described = {k: v for k, v in described.items() if v is not None}
    if text_of(form, "step") != "confirm":
        return console.render(
            request, "outbox_confirm.html", count=count, scope=scope, fields=described
        )
    reason = reason_of(form)
    expected = int_of(form, "expected")
    outcome: int | RequeueRefused
    if scope == "one" and row_id is not None:
        outcome = await requeue(console.engine, [row_id])
    elif scope == "filter":
        outcome = await requeue_matching(console.engine, wanted)
    else:
        outcome = await requeue_all_parked(console.engine)
    done = outcome if isinstance(outcome, int) else 0
    text = f"requeued {done} row(s)" if isinstance(outcome, int) else f"nothing requeued: {outcome}"
    if expected is not None and done != expected:
        text += f" ({expected} were counted when confirmed)"
    await console.audit(
        principal,
        action="outbox.requeue",
        target="outbox_events",
        filter=described,
        count=done,
        reason=reason,
        outcome=text,
    )
    return console.render(request, "done.html", message=text, back="/outbox?which=parked")


routes = [
    Route("/outbox", rows_page, methods=["GET"]),
    Route("/outbox/requeue", requeue_action, methods=["POST"]),
]
