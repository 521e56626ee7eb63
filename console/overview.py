"""The overview: the picture ``outboxkit status`` prints, live, each number a link to its list.

It reads through :func:`outboxkit.ops.status.read_status`, so a source that cannot be read is
shown as unreachable and the rest of the page as usual. The workflow counts come from
:func:`outboxkit.ops.workflows.state_counts`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from outboxkit.console.context import console_of
from outboxkit.ops import workflows as wf_ops
from outboxkit.ops.access import OpsError, database_bounded
from outboxkit.ops.status import DlqInfo, Unreachable, cause_line, read_status
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


async def _picture(request: Request) -> dict[str, Any]:
    console = console_of(request)
    config = console.config
    report = await read_status(
        config.db_url,
        config.kafka,
        groups=config.groups,
        dlq_topics=config.dlq_topics,
        timeout=config.timeout,
    )
    workflows: dict[tuple[str, str], int] | Unreachable
    try:
        async with (
            database_bounded(console.engine, config.timeout),
            asyncio.timeout(config.timeout),
            AsyncSession(console.engine) as session,
        ):
            workflows = await wf_ops.state_counts(session)
    except (OpsError, TimeoutError) as error:
        workflows = Unreachable(cause_line(error) if str(error) else "timed out")
    except Exception as error:
        workflows = Unreachable(cause_line(error))
    dlq = report.dlq
    return {
        "report": report,
        "database": report.database,
        "unreachable": report.unreachable(),
        "workflows": workflows,
        "dlq_infos": [] if isinstance(dlq, Unreachable) else dlq,
        "Unreachable": Unreachable,
        "DlqInfo": DlqInfo,
    }


async def overview(request: Request) -> Response:
    """The whole page."""
    return console_of(request).render(request, "overview.html", **await _picture(request))


async def live(request: Request) -> Response:
    """The page's live part, fetched again every few seconds by console.js."""
    return console_of(request).render(request, "overview_live.html", **await _picture(request))


routes = [
    Route("/", overview, methods=["GET"]),
    Route("/overview/live", live, methods=["GET"]),
]
