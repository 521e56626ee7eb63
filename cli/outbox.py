"""``outboxkit outbox``: list parked or pending outbox rows, requeue parked ones, and the
WAL-message gaps lost with a logical slot."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, TypeVar

import typer
from outboxkit.cli.errors import CliError
from outboxkit.cli.options import DbUrlOption, JsonOption, TimeoutOption, settings_from
from outboxkit.ops.access import database_bounded, ops_engine, require_tables
from outboxkit.ops.formatting import format_age, format_ms, ops_console, os_user, ranges
from outboxkit.ops.outbox_rows import (
    OutboxRow,
    RequeueRefused,
    Which,
    count_rows,
    list_rows,
    requeue,
    requeue_all_parked,
)
from outboxkit.ops.slot_gaps import Gap, acknowledge, list_gaps
from outboxkit.outbox import jsonable
from outboxkit.outbox.tables import outbox_events, outbox_slot_gaps
from rich.table import Table
from rich.text import Text
from sqlalchemy.ext.asyncio import AsyncEngine

outbox_app = typer.Typer(
    help="The outbox: pending, parked and scheduled rows, requeue, WAL-message gaps.",
    no_args_is_help=True,
)

T = TypeVar("T")
ERROR_WIDTH = 80
IdsArgument = typer.Argument(None, help="Ids of parked rows.")
AckOption = typer.Option(None, "--ack", help="Acknowledge the gap with this id (repeatable).")


def _run(db_url: str | None, timeout: float, work: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    settings = settings_from(db_url)

    async def main() -> T:
        engine = ops_engine(settings.db_url, timeout)
        try:
            async with database_bounded(engine, timeout):
                await require_tables(engine, [outbox_events.name])
                return await work(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


@outbox_app.command("list")
def list_command(
    parked: bool = typer.Option(
        False, "--parked", help="Parked rows (oldest parked first); default: pending rows."
    ),
    scheduled: bool = typer.Option(
        False, "--scheduled", help="Rows scheduled for later (next due first), not yet due."
    ),
    limit: int = typer.Option(1000, "--limit", min=1, help="Rows listed at most."),
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
    timeout: float = TimeoutOption,
) -> None:
    """List pending rows (due now), or parked (--parked) or scheduled (--scheduled) ones,
    without their payloads."""
    if parked and scheduled:
        raise CliError("give --parked or --scheduled, not both")
    what: Which = "parked" if parked else "scheduled" if scheduled else "pending"

    async def query(engine: AsyncEngine) -> tuple[list[OutboxRow], int, int, int]:
        rows, now = await list_rows(engine, which=what, limit=limit)
        total = len(rows) if len(rows) < limit else await count_rows(engine, which=what)
        later = await count_rows(engine, which="scheduled") if what == "pending" else 0
        return rows, now, total, later

    rows, now, total, later = _run(db_url, timeout, query)
    # Rows scheduled for later are not backlog: the pending view names their count apart.
    aside = f" ({later} more scheduled for later: --scheduled)" if later else ""
    if as_json:
        document: dict[str, Any] = {what: total, "shown": len(rows)}
        if what == "pending":
            document["scheduled"] = later
        document["rows"] = [jsonable.as_json(row) for row in rows]
        typer.echo(json.dumps(document, indent=2))
        return
    console = ops_console()
    if not rows:
        console.print(f"no {what} outbox rows{aside}")
        return
    table = Table(title=Text(f"{total} {what} outbox row(s){aside}"))
    time_column = {"parked": "PARKED", "scheduled": "DUE"}.get(what, "NEXT ATTEMPT")
    columns = ("ID", "TYPE", "SOURCE", "EVENT ID", "TOPIC", "ATTEMPTS", time_column, "LAST ERROR")
    for name in columns:
        table.add_column(name, justify="right" if name in ("ID", "ATTEMPTS") else "left")
    for row in rows:
        error = row.last_error or "-"
        if len(error) > ERROR_WIDTH:
            error = error[: ERROR_WIDTH - 3] + "..."
        moment = _moment(row, now)
        cells = (row.id, row.type, row.source, row.event_id, row.topic, row.attempts, moment, error)
        table.add_row(*(Text(str(cell)) for cell in cells))
    console.print(table)
    if len(rows) < total:
        console.print(f"showing the first {len(rows)} of {total} (--limit)")


def _moment(row: OutboxRow, now: int) -> str:
    if row.parked_ms is not None:
        return f"{format_ms(row.parked_ms)} ({format_age(now - row.parked_ms)} ago)"
    if row.deliver_at_ms is not None and row.deliver_at_ms > now:
        return f"{format_ms(row.deliver_at_ms)} (in {format_age(row.deliver_at_ms - now)})"
    if row.available_ms > now:
        return f"in {format_age(row.available_ms - now)}"
    return "due"


@outbox_app.command("requeue")
def requeue_command(
    ids: list[int] | None = IdsArgument,
    all_parked: bool = typer.Option(False, "--all-parked", help="Requeue every parked row."),
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
    timeout: float = TimeoutOption,
) -> None:
    """Make parked rows pending again (fresh attempts); the relay then publishes them."""
    if all_parked == bool(ids):
        raise CliError("give the ids of parked rows, or --all-parked (not both)")

    async def work(engine: AsyncEngine) -> RequeueRefused | int:
        if all_parked:
            return await requeue_all_parked(engine)
        return await requeue(engine, ids or [])

    outcome = _run(db_url, timeout, work)
    if isinstance(outcome, RequeueRefused):
        raise CliError(f"nothing requeued: {outcome}")
    if as_json:
        chosen: Any = "all-parked" if all_parked else sorted(set(ids or []))
        typer.echo(json.dumps({"requeued": outcome, "ids": chosen}, indent=2))
        return
    typer.echo(f"requeued {outcome} row(s)")


@outbox_app.command("gaps")
def gaps_command(
    ack: list[int] | None = AckOption,
    ack_all: bool = typer.Option(False, "--ack-all", help="Acknowledge every open gap."),
    acknowledged: bool = typer.Option(
        False, "--all", help="List acknowledged gaps too (default: the open ones)."
    ),
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
    timeout: float = TimeoutOption,
) -> None:
    """WAL-message gaps: outbox WAL messages lost with a logical slot (a failover on
    PostgreSQL before 17, a dropped or invalidated slot). Listed until acknowledged."""
    if ack and ack_all:
        raise CliError("give --ack IDS or --ack-all, not both")
    if ack or ack_all:
        ids = None if ack_all else ack

        async def work(engine: AsyncEngine) -> list[int]:
            await require_tables(engine, [outbox_slot_gaps.name])
            return await acknowledge(engine, ids, os_user())

        done = _run(db_url, timeout, work)
        if as_json:
            typer.echo(json.dumps({"acknowledged": done}, indent=2))
            return
        missing = sorted(set(ack or []) - set(done))
        typer.echo(f"acknowledged {len(done)} gap(s)" + (f": {ranges(done)}" if done else ""))
        if missing:
            raise CliError(f"no open gap with id {ranges(missing)}")
        return

    async def read(engine: AsyncEngine) -> list[Gap]:
        await require_tables(engine, [outbox_slot_gaps.name])
        return await list_gaps(engine, acknowledged=acknowledged)

    gaps = _run(db_url, timeout, read)
    if as_json:
        typer.echo(json.dumps({"gaps": [asdict(gap) for gap in gaps]}, indent=2))
        return
    if not gaps:
        typer.echo("no open WAL-message gap" if not acknowledged else "no WAL-message gap")
        return
    for gap in gaps:
        state = (
            "open"
            if gap.acknowledged_ms is None
            else f"acknowledged {format_ms(gap.acknowledged_ms)} by {gap.acknowledged_by}"
        )
        typer.echo(f"{gap.line()}; detected {format_ms(gap.detected_ms)}, {state}")
        typer.echo(f"  count: {gap.count_note}")
