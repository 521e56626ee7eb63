"""The overview: the picture ``outboxkit status`` prints, live, each number a link to its list.

It reads through :func:`outboxkit.ops.status.report_status` with the console's kept database
engine and Kafka clients, so a source that cannot be read is shown as unreachable and the rest
of the page as usual. The workflow counts come from :func:`outboxkit.ops.workflows.state_counts`.
One picture is shared by the viewers of the same few seconds (``report_ttl_s``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from outboxkit.console.context import Console, console_of
from outboxkit.ops import workflows as wf_ops
from outboxkit.ops.access import OpsError, database_bounded
from outboxkit.ops.dlq.reader import DlqReader
from outboxkit.ops.status import DlqInfo, Unreachable, cause_line, report_status
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


async def _read_picture(console: Console) -> dict[str, Any]:
    config = console.config
    reader = await console.kafka.reader()
    # the workflow counts on a connection of their own, while the report is read
    report, workflows = await asyncio.gather(
        report_status(
            console.engine,
            reader,
            db_url=config.db_url,
            groups=config.groups,
            dlq_topics=config.dlq_topics,
            timeout=config.timeout,
        ),
        _workflow_counts(console),
    )
    if isinstance(reader, DlqReader) and report.kafka is not None:
        console.kafka.failed(report.kafka)  # the broker went away: connect again later
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


async def _workflow_counts(console: Console) -> dict[tuple[str, str], int] | Unreachable:
    timeout = console.config.timeout
    try:
        async with (
            database_bounded(console.engine, timeout),
            asyncio.timeout(timeout),
            AsyncSession(console.engine) as session,
        ):
            return await wf_ops.state_counts(session)
    except (OpsError, TimeoutError) as error:
        return Unreachable(cause_line(error) if str(error) else "timed out")
    except Exception as error:
        return Unreachable(cause_line(error))


async def _picture(request: Request) -> dict[str, Any]:
    console = console_of(request)
    shared = console.shared_report("overview", lambda: _read_picture(console))
    picture: dict[str, Any] = await shared.get()
    return picture


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
