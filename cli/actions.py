"""``outboxkit actions``: list, show and resolve agent operations; sweep and clean up.

Bad input raises :class:`outboxkit.cli.errors.CliError` (one line, exit code 2).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import typer
from outboxkit.actions.cleanup import purge_expired
from outboxkit.actions.errors import ActionError
from outboxkit.actions.events import DEFAULT_TOPIC
from outboxkit.actions.records import AuditEntry, OperationRecord, Resolution
from outboxkit.actions.states import State
from outboxkit.actions.store import ActionStore
from outboxkit.cli.errors import CliError
from outboxkit.cli.options import DbUrlOption, duration_option, settings_from
from outboxkit.cli.progress import progress_note
from outboxkit.cli.sessions import in_session
from outboxkit.ops.actions import resolve_operation, resolving_store, shown, shown_entry
from outboxkit.ops.approvals import WaitingApproval, waiting_approvals
from outboxkit.ops.formatting import format_age, parse_keyset
from outboxkit.outbox.clock import read_db_now_ms
from outboxkit.outbox.db import make_async_engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

actions_app = typer.Typer(
    help="Agent actions: list, show and resolve operations.", no_args_is_help=True
)

T = TypeVar("T")
TenantOption = typer.Option(..., "--tenant", help="The operation's tenant.")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of text.")


@actions_app.command("list")
def list_command(
    state: str | None = typer.Option(None, "--state", help="PENDING, RUNNING, UNKNOWN, ..."),
    older_than: float | None = duration_option(
        None,
        "--older-than",
        minimum_s=0.0,
        help="Last state change at least this long ago: 500ms, 30s, 10m.",
    ),
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant."),
    needs_attention: bool = typer.Option(
        False, "--needs-attention", help="Only operations flagged for a person."
    ),
    limit: int = typer.Option(100, "--limit", min=1, max=10_000),
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
) -> None:
    """List operations, oldest state change first."""
    chosen_state = parse_state(state) if state is not None else None

    async def query(session: AsyncSession) -> tuple[list[OperationRecord], int]:
        found = await ActionStore().list_operations(
            session,
            tenant=tenant,
            state=chosen_state,
            older_than_s=older_than,
            needs_attention=True if needs_attention else None,
            limit=limit,
        )
        return found, await read_db_now_ms(session)

    operations, now = _run(db_url, query)
    if as_json:
        typer.echo(json.dumps([shown(op) for op in operations], indent=2))
        return
    if not operations:
        typer.echo("no operations")
        return
    typer.echo(f"{'TENANT':<16} {'KEY':<36} {'STATE':<12} {'TRIES':>5} {'AGE':>9}  FLAG  ACTION")
    for op in operations:
        flag = "!" if op.needs_attention else ""
        age = format_age(now - op.updated_ms)
        typer.echo(
            f"{op.tenant:<16} {op.key:<36} {op.state:<12} {op.attempts:>5} {age:>9}  "
            f"{flag:<4}  {op.action_type}"
        )


@actions_app.command("show")
def show_command(
    key: str = typer.Argument(..., help="The operation key."),
    tenant: str = TenantOption,
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
) -> None:
    """Show one operation with its audit trail."""

    async def query(session: AsyncSession) -> tuple[OperationRecord | None, list[AuditEntry]]:
        store = ActionStore()
        return await store.get(session, tenant, key), await store.history(session, tenant, key)

    operation, trail = _run(db_url, query)
    if operation is None and not trail:
        raise CliError(f"no operation {key!r} for tenant {tenant!r}")
    if as_json:
        document = {
            "operation": shown(operation) if operation else None,
            "audit": [shown_entry(entry) for entry in trail],
        }
        typer.echo(json.dumps(document, indent=2))
        return
    if operation is None:
        typer.echo("(the operation was cleaned up; its audit trail remains)")
    else:
        for name, value in shown(operation).items():
            if name.endswith("_ms") and value is not None:
                value = f"{value} ({format_time(value)})"
            elif name == "result":
                value = json.dumps(value)
            typer.echo(f"{name + ':':<18} {value}")
    typer.echo("audit:")
    for entry in trail:
        typer.echo(
            f"  {format_time(entry.at_ms)}  g{entry.generation} a{entry.attempt}  "
            f"{entry.from_state or '-'} -> {entry.to_state}  by {entry.actor}: {entry.reason}"
        )


@actions_app.command("resolve")
def resolve_command(
    key: str = typer.Argument(..., help="The operation key."),
    tenant: str = TenantOption,
    succeeded: bool = typer.Option(False, "--succeeded", help="It happened: SUCCEEDED."),
    failed: bool = typer.Option(False, "--failed", help="It did not and must not: FAILED_FINAL."),
    retry: bool = typer.Option(
        False, "--retry", help="It did not happen: PENDING, the next begin runs it again."
    ),
    result: str | None = typer.Option(None, "--result", help="JSON result (with --succeeded)."),
    external_ref: str | None = typer.Option(None, "--external-ref", help="With --succeeded."),
    by: str = typer.Option(..., "--by", help="Who decides (recorded in the audit trail)."),
    reason: str = typer.Option(..., "--reason", help="Why (recorded in the audit trail)."),
    topic: str = typer.Option(
        DEFAULT_TOPIC, "--topic", envvar="OUTBOXKIT_ACTIONS_TOPIC", help="Topic of its event."
    ),
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
) -> None:
    """Resolve an UNKNOWN (or PENDING) operation by hand; audited and published."""
    chosen = [
        resolution
        for flag, resolution in (
            (succeeded, Resolution.SUCCEEDED),
            (failed, Resolution.FAILED),
            (retry, Resolution.RETRY),
        )
        if flag
    ]
    if len(chosen) != 1:
        raise CliError("give exactly one of --succeeded, --failed or --retry")
    if (result is not None or external_ref is not None) and chosen[0] is not Resolution.SUCCEEDED:
        raise CliError("--result and --external-ref go with --succeeded only")
    value: Any = None
    if result is not None:
        try:
            value = json.loads(result)
        except ValueError as error:
            raise CliError(f"--result is not valid JSON: {error}") from None
    try:
        store = resolving_store(topic)
    except ValueError as error:
        raise CliError(str(error)) from None

    async def change(session: AsyncSession) -> OperationRecord:
        return await resolve_operation(
            session,
            store,
            tenant=tenant,
            key=key,
            resolution=chosen[0],
            by=by,
            reason=reason,
            result=value,
            external_ref=external_ref,
        )

    operation = _run(db_url, change)
    if as_json:
        typer.echo(json.dumps({"resolved": 1, "operation": shown(operation)}, indent=2))
        return
    typer.echo(f"{operation.key} ({operation.tenant}): {operation.state}")


@actions_app.command("approvals")
def approvals_command(
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant."),
    following: str | None = typer.Option(
        None,
        "--next",
        metavar="MS.ID",
        help="The next page: the keyset the previous page printed after NEXT.",
    ),
    limit: int = typer.Option(100, "--limit", min=1, max=10_000),
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
) -> None:
    """List agent tool calls waiting for a person's approval, oldest first, with their expiry.

    Text shows the arguments' hash; --json adds the arguments (secret fields redacted).
    """
    try:
        keyset = parse_keyset(following) if following is not None else None
    except ValueError:
        raise CliError(f"invalid --next {following!r}: use MS.ID as printed after NEXT") from None

    async def query(session: AsyncSession) -> tuple[list[WaitingApproval], int]:
        now = await read_db_now_ms(session)
        found = await waiting_approvals(
            session, now_ms=now, tenant=tenant, limit=limit, after=keyset
        )
        return found, now

    waiting, now = _run(db_url, query)
    last = waiting[-1].keyset if len(waiting) == limit else None
    if as_json:
        document = {
            "approvals": [approval.shown(with_args=True) for approval in waiting],
            "next": last,
        }
        typer.echo(json.dumps(document, indent=2))
        return
    if not waiting:
        typer.echo("no approval waiting")
        return
    typer.echo(
        f"{'TENANT':<16} {'RUN':<24} {'CALL':<20} {'TOOL':<16} {'ARGS HASH':<16} "
        f"{'WAITING':>9}  EXPIRES"
    )
    for approval in waiting:
        expiry = format_time(approval.expires_ms)
        if approval.expired:
            expiry += " (expired)"
        typer.echo(
            f"{approval.tenant:<16} {approval.run_id or '-':<24} "
            f"{approval.tool_call_id or '-':<20} {approval.tool:<16} "
            f"{approval.args_hash[:16]:<16} {format_age(now - approval.requested_ms):>9}  {expiry}"
        )
    if last is not None:
        typer.echo(f"NEXT: --next {last}")


@actions_app.command("sweep")
def sweep_command(
    limit: int = typer.Option(1000, "--limit", min=1),
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
) -> None:
    """Mark RUNNING operations whose lease expired as UNKNOWN."""

    async def change(session: AsyncSession) -> list[OperationRecord]:
        async with session.begin():
            return await ActionStore().sweep_expired_leases(session, limit=limit)

    with progress_note("sweeping expired leases", enabled=not as_json):
        swept = _run(db_url, change)
    if as_json:
        keys = [{"tenant": op.tenant, "key": op.key} for op in swept]
        typer.echo(json.dumps({"marked_unknown": len(swept), "operations": keys}, indent=2))
        return
    typer.echo(f"marked unknown: {len(swept)}")


@actions_app.command("cleanup")
def cleanup_command(
    chunk_size: int = typer.Option(500, "--chunk-size", min=1, max=100_000),
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
) -> None:
    """Delete expired SUCCEEDED, FAILED_FINAL and PENDING operations in chunks."""
    settings = settings_from(db_url)

    async def purge() -> int:
        engine = make_async_engine(settings.db_url)
        try:
            return await purge_expired(
                async_sessionmaker(engine, expire_on_commit=False), chunk_size=chunk_size
            )
        finally:
            await engine.dispose()

    deleted = asyncio.run(purge())
    typer.echo(json.dumps({"deleted": deleted}) if as_json else f"deleted: {deleted}")


def parse_state(text: str) -> State:
    """A state name, case-insensitive; :class:`CliError` if unknown."""
    try:
        return State(text.strip().upper())
    except ValueError:
        names = ", ".join(state.value for state in State)
        raise CliError(f"invalid state {text!r}: use one of {names}") from None


def format_time(ms: int) -> str:
    """Epoch milliseconds as an ISO-8601 UTC time."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _run(db_url: str | None, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    try:
        return in_session(db_url, work)
    except ActionError as error:
        raise CliError(str(error)) from None
