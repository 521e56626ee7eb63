"""``outboxkit workflows``: list, show, cancel, resume and escalate instances; run a worker.

``list`` and ``show`` read the tables (``--db-url``). ``cancel``, ``resume`` and ``escalate``
go through the application's engine (``--app MODULE:ENGINE``), so an operator's decision is
checked against the instance's definition, and its history record is redacted and published
exactly as the engine's own (same events topic, same source, same ``redact_keys``).
``run MODULE:ENGINE`` is a worker process; SIGTERM stops it gracefully (exit 0).

MODULE:ENGINE names a :class:`~outboxkit.workflows.WorkflowEngine`, which uses its own
database, or a function ``(sessions: async_sessionmaker) -> WorkflowEngine``, which gets
sessions on ``--db-url`` (or ``OUTBOXKIT_DB_URL``). Bad input raises
:class:`outboxkit.cli.errors.CliError` (one line, exit code 2); so do an unknown instance and
an action its state does not allow.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import typer
from outboxkit.cli import signals
from outboxkit.cli.errors import CliError
from outboxkit.cli.options import (
    DbUrlOption,
    JsonLogsOption,
    LogLevelOption,
    duration_option,
    import_target,
    settings_from,
)
from outboxkit.cli.sessions import in_session
from outboxkit.ops import workflows as ops
from outboxkit.ops.formatting import format_age, format_ms
from outboxkit.outbox.clock import read_db_now_ms
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.logs import configure_logging
from outboxkit.outbox.metrics_server import DEFAULT_ADDRESS, serve_metrics
from outboxkit.workflows import WorkflowEngine, WorkflowRecord, WorkflowWorker
from outboxkit.workflows.metrics import DEFAULT_STUCK_AFTER_S, WorkflowCollector
from prometheus_client import REGISTRY
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

workflows_app = typer.Typer(
    help="Durable workflows: list, show, cancel, resume, escalate; run a worker.",
    no_args_is_help=True,
)

log = logging.getLogger("outboxkit.workflows")
T = TypeVar("T")
JsonOption = typer.Option(False, "--json", help="Print JSON instead of text.")
AppOption = typer.Option(
    ...,
    "--app",
    envvar="OUTBOXKIT_WORKFLOW_APP",
    metavar="MODULE:ENGINE",
    help="The application's WorkflowEngine, or a function of the sessions returning it "
    "[env: OUTBOXKIT_WORKFLOW_APP].",
)
ByOption = typer.Option(..., "--by", help="Who decides (recorded in the history).")
ReasonOption = typer.Option(..., "--reason", help="Why (recorded in the history).")


@workflows_app.command("list")
def list_command(
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant."),
    name: str | None = typer.Option(None, "--name", help="Only this workflow."),
    state: list[str] | None = typer.Option(  # noqa: B008 - typer reads the default
        None, "--state", help="Only these states (repeat, or comma-separated)."
    ),
    stuck_after: float | None = duration_option(
        None,
        "--stuck-after",
        minimum_s=0.0,
        help="Only work due at least this long and not taken forward (30s, 10m, 2h), oldest first.",
    ),
    limit: int = typer.Option(100, "--limit", min=1, max=10_000),
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
) -> None:
    """List instances, most recently changed first."""
    states = [part.strip() for given in state or () for part in given.split(",") if part.strip()]
    stuck_ms = None if stuck_after is None else round(stuck_after * 1000)

    async def query(session: AsyncSession) -> tuple[list[WorkflowRecord], int]:
        now = await read_db_now_ms(session)
        found = await ops.list_workflows(
            session,
            now_ms=now,
            tenant=tenant,
            name=name,
            states=states,
            stuck_after_ms=stuck_ms,
            limit=limit,
        )
        return found, now

    records, now = in_session(db_url, query)
    rows = [ops.summary(record, now) for record in records]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no workflows")
        return
    headers = (
        "TENANT",
        "WORKFLOW",
        "NAME",
        "STATE",
        "STATUS",
        "AGE",
        "IN STATE",
        "DEADLINE",
        "OWNER",
        "TRIES",
        "NEXT RUN",
        "UNKNOWN",
        "APPROVAL",
        "CANCEL",
    )
    lines = [
        (
            row["tenant"],
            row["workflow_id"],
            f"{row['name']} v{row['version']}",
            row["state"],
            row["status"] + ("*" if row["leased_by"] else ""),
            format_age(row["age_ms"]),
            format_age(row["in_state_ms"]),
            ops.age_text(now, row["deadline_ms"])
            + (f" ({row['deadline_kind']})" if row["deadline_kind"] else ""),
            row["owner"] or "-",
            str(row["attempts"]),
            ops.age_text(now, row["next_run_ms"]),
            row["open_unknown"] or "-",
            row["approval"],
            "asked" if row["cancel_requested_ms"] is not None else "-",
        )
        for row in rows
    ]
    for line in _table(headers, lines):
        typer.echo(line)


@workflows_app.command("show")
def show_command(
    tenant: str = typer.Argument(..., help="The instance's tenant."),
    workflow_id: str = typer.Argument(..., help="The workflow id."),
    as_json: bool = JsonOption,
    app: str | None = typer.Option(
        None,
        "--app",
        metavar="MODULE:ENGINE",
        help="The application's engine, to show the retry budget of the pending step "
        "(and hide its definitions' redact_keys).",
    ),
    db_url: str | None = DbUrlOption,
) -> None:
    """Show one instance: where it is, what comes next, its effects, unknowns and history."""

    async def query(session: AsyncSession) -> ops.WorkflowReport | None:
        return await ops.describe(
            session, tenant, workflow_id, now_ms=await read_db_now_ms(session)
        )

    report = in_session(db_url, query)
    if report is None:
        raise CliError(f"no workflow {workflow_id!r} of tenant {tenant!r}")
    if app is not None:
        report = _with_app(app, db_url, report)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
        return
    for line in _report_lines(report):
        typer.echo(line)


@workflows_app.command("cancel")
def cancel_command(
    tenant: str = typer.Argument(..., help="The instance's tenant."),
    workflow_id: str = typer.Argument(..., help="The workflow id."),
    by: str = ByOption,
    reason: str = ReasonOption,
    app: str = AppOption,
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
) -> None:
    """Ask for a cancel; a worker unwinds the instance (compensations first) at its next step."""
    engine = load_engine(app, db_url)
    record = _change(engine, lambda s: engine.cancel(s, tenant, workflow_id, by=by, reason=reason))
    _report_change(
        "cancel asked", record, as_json, f"{_line(record)}: cancel asked; a worker carries it out"
    )


@workflows_app.command("resume")
def resume_command(
    tenant: str = typer.Argument(..., help="The instance's tenant."),
    workflow_id: str = typer.Argument(..., help="The workflow id."),
    by: str = ByOption,
    reason: str = ReasonOption,
    to: str | None = typer.Option(
        None, "--to", help="The state to go on in (default: where it was before human_review)."
    ),
    app: str = AppOption,
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
) -> None:
    """Take an instance out of human_review (resolve its unknown operation first)."""
    engine = load_engine(app, db_url)
    record = _change(
        engine,
        lambda s: engine.resume(s, tenant, workflow_id, by=by, reason=reason, to_state=to),
    )
    _report_change("resumed", record, as_json)


@workflows_app.command("escalate")
def escalate_command(
    tenant: str = typer.Argument(..., help="The instance's tenant."),
    workflow_id: str = typer.Argument(..., help="The workflow id."),
    by: str = ByOption,
    reason: str = ReasonOption,
    app: str = AppOption,
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
) -> None:
    """Send an instance to human_review now."""
    engine = load_engine(app, db_url)
    record = _change(
        engine, lambda s: engine.escalate(s, tenant, workflow_id, by=by, reason=reason)
    )
    _report_change("escalated", record, as_json)


def _report_change(
    change: str, record: WorkflowRecord, as_json: bool, text: str | None = None
) -> None:
    """What an operator's decision changed: one line, or with ``--json`` a document."""
    if not as_json:
        typer.echo(text or _line(record))
        return
    document = {
        "changed": 1,
        "change": change,
        "tenant": record.tenant,
        "workflow_id": record.workflow_id,
        "state": record.state,
        "status": record.status.value,
    }
    typer.echo(json.dumps(document, indent=2))


@workflows_app.command("run")
def run_command(
    target: str = typer.Argument(..., metavar="MODULE:ENGINE", help="The engine to run."),
    db_url: str | None = DbUrlOption,
    batch: int = typer.Option(10, "--batch", min=1, max=1000, help="Instances per claim."),
    poll_interval: float = duration_option(
        1.0, "--poll-interval", minimum_s=0.001, help="Sleep with nothing due (500ms, 1s, ...)."
    ),
    no_listen: bool = typer.Option(False, "--no-listen", help="Poll only, no LISTEN/NOTIFY."),
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", min=1, max=65535, help="Serve /metrics, /healthz and /readyz."
    ),
    metrics_address: str = typer.Option(
        DEFAULT_ADDRESS, "--metrics-address", help="Address to serve them on (0.0.0.0: all)."
    ),
    stuck_after: float = duration_option(
        DEFAULT_STUCK_AFTER_S,
        "--stuck-after",
        minimum_s=0.0,
        help="Due work waiting this long counts in outboxkit_workflow_stuck.",
    ),
) -> None:
    """Advance the engine's workflows until SIGTERM (exit 0)."""
    configure_logging(log_level, json_lines=json_logs)
    engine = load_engine(target, db_url)
    worker = WorkflowWorker(
        engine, batch=batch, poll_interval_s=poll_interval, listen=not no_listen
    )
    if metrics_port is not None:
        REGISTRY.register(
            WorkflowCollector.for_url(
                _url_of(engine), clock=engine.clock, stuck_after_s=stuck_after
            )
        )
        serve_metrics(metrics_port, metrics_address)
    asyncio.run(_work(engine, worker))


async def _work(engine: WorkflowEngine, worker: WorkflowWorker) -> None:
    """Work until SIGTERM or SIGINT, which stop the worker gracefully (exit 0).

    As for ``outboxkit relay``: a stop that came during start-up means the worker never starts,
    and its ``started`` line is logged only once the handlers are in place.
    """
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    def stop() -> None:
        stopping.append(loop.create_task(_stop_quietly(worker)))

    for signum in signals.STOP_SIGNALS:
        loop.add_signal_handler(signum, stop)
    try:
        if signals.requested():
            return
        log.info("workflow worker %s started (batch %d)", worker.holder, worker.batch)
        await worker.run()
        await asyncio.gather(*stopping)
        log.info("workflow worker %s stopped after %d steps", worker.holder, worker.steps)
    finally:
        for signum in signals.STOP_SIGNALS:
            loop.remove_signal_handler(signum)
        signals.hold_again()
        await _dispose(engine)


async def _stop_quietly(worker: WorkflowWorker) -> None:
    with contextlib.suppress(Exception):
        await worker.stop()


def load_engine(target: str, db_url: str | None = None) -> WorkflowEngine:
    """The engine MODULE:ENGINE names: an engine, or built by a function of the sessions."""
    found = import_target(target, "MODULE:ENGINE", "purchasing.workflows:engine")
    if isinstance(found, WorkflowEngine):
        if db_url is not None:
            raise CliError(
                f"{target} is an engine with its own database: --db-url goes with a function "
                "of the sessions that returns the engine"
            )
        return found
    if callable(found) and not isinstance(found, type):
        settings = settings_from(db_url)
        sessions = async_sessionmaker(make_async_engine(settings.db_url), expire_on_commit=False)
        built = found(sessions)
        if isinstance(built, WorkflowEngine):
            return built
        raise CliError(f"{target} returned a {type(built).__name__}, not a WorkflowEngine")
    raise CliError(
        f"{target} is a {type(found).__name__}, not a WorkflowEngine or a function of the "
        "sessions that returns one"
    )


def _with_app(app: str, db_url: str | None, report: ops.WorkflowReport) -> ops.WorkflowReport:
    """``report`` with the pending state's ``max_attempts`` in the instance's own definition
    version, and the definitions' ``redact_keys``."""
    engine = load_engine(app, db_url)
    asyncio.run(_dispose(engine))  # only its definitions are read
    record = report.record
    spec = engine.registry.get(record.name, record.version).states.get(record.state)
    return dataclasses.replace(
        report,
        max_attempts=None if spec is None else spec.budget.max_attempts,
        redact_keys=engine.sink.redact_keys,
    )


def _bind(engine: WorkflowEngine) -> AsyncEngine:
    bind = engine.sessions.kw.get("bind")
    if not isinstance(bind, AsyncEngine):
        raise CliError("the engine's sessions are bound to no database engine")
    return bind


def _url_of(engine: WorkflowEngine) -> str:
    return _bind(engine).url.render_as_string(hide_password=False)


async def _dispose(engine: WorkflowEngine) -> None:
    with contextlib.suppress(CliError):
        await _bind(engine).dispose()


def _change(
    engine: WorkflowEngine, work: Callable[[AsyncSession], Awaitable[WorkflowRecord]]
) -> WorkflowRecord:
    """Run an operator's decision in one transaction of the engine's database."""

    async def main() -> WorkflowRecord:
        try:
            return await ops.decide(engine, work)
        finally:
            await _dispose(engine)

    return asyncio.run(main())


def _line(record: WorkflowRecord) -> str:
    return f"{record.workflow_id} ({record.tenant}): {record.state} ({record.status.value})"


def _table(headers: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in (headers, *rows)
    ]


def _report_lines(report: ops.WorkflowReport) -> list[str]:
    """``workflows show`` as text."""
    record, now = report.record, report.now_ms
    deadline_ms, kind = ops.deadline(record)
    lines = [
        f"workflow:      {record.tenant}/{record.workflow_id} ({record.name} v{record.version})",
        f"state:         {record.state} ({record.status.value}) for "
        f"{format_age(now - record.state_since_ms)}; age {format_age(now - record.created_ms)}",
        f"owner:         {record.owner or '-'}",
        "deadline:      "
        + (
            "-"
            if deadline_ms is None
            else f"{format_ms(deadline_ms)} ({kind}, {ops.age_text(now, deadline_ms)})"
        ),
        f"next:          {report.next_action}",
    ]
    good = report.last_good
    lines.append(
        "last good:     "
        + (
            "-"
            if good is None
            else f"#{good.seq} {good.kind} {good.from_state or '-'} -> {good.to_state} "
            f"at {format_ms(good.at_ms)} by {good.actor}"
        )
    )
    step = ops.pending_step(record)
    if step is not None:
        parts = [f"{step['state']}, attempts {step['attempts']}"]
        if step["failure_class"]:
            parts.append(f"{step['failure_class']}: {step['last_error']}")
        if step["open_unknown"]:
            parts.append(f"open unknown {step['open_unknown']}")
        if step["run_at_ms"] is not None:
            run_at = step["run_at_ms"]
            parts.append(f"run at {format_ms(run_at)} ({ops.age_text(now, run_at)})")
        if step["leased_by"]:
            parts.append(f"leased by {step['leased_by']}")
        lines.append("pending step:  " + "; ".join(parts))
    lines.append("approval:      " + _approval_text(record))
    if record.cancel_requested_ms is not None:
        lines.append(
            f"cancel:        asked at {format_ms(record.cancel_requested_ms)} "
            f"({record.cancel_reason})"
        )
    if record.compensations:
        names = ", ".join(f"{c.name} for {c.effect_key}" for c in record.compensations)
        lines.append(f"compensations: {names}")
    lines.append("effects:")
    lines += [
        f"  #{e['seq']} {e['action_type']} key {e['key']} executed={e['executed']} "
        f"ref {e['external_ref'] or '-'}"
        for e in ops.effects(report.history)
    ] or ["  -"]
    lines.append("unknowns:")
    lines += [
        f"  {key} {'(open) ' if key == record.open_unknown else ''}"
        + ("not in the ledger" if op is None else f"{op.state.value} ({op.action_type})")
        for key, op in report.unknowns
    ] or ["  -"]
    lines.append("history:")
    lines += [
        f"  #{h.seq} {format_ms(h.at_ms)} {h.kind:<12} {h.from_state or '-'} -> {h.to_state} "
        f"by {h.actor}" + (f": {ops.short_decision(h)}" if h.decision is not None else "")
        for h in report.history
    ]
    lines.append("signals:")
    lines += [
        f"  {s.type} from {s.source} ({s.event_id}): {s.outcome}"
        + (f" ({s.reason})" if s.reason else "")
        for s in report.signals
    ] or ["  -"]
    return lines


def _approval_text(record: WorkflowRecord) -> str:
    status = ops.approval_status(record)
    if status in (ops.AWAITING, ops.RESUMING) and record.wait is not None:
        return f"{status}, request hash {record.wait.request_hash}"
    if status == ops.APPROVED and record.approval is not None:
        approval = record.approval
        return (
            f"approved, request hash {approval.request_hash}, by {approval.principal or '-'} "
            f"({approval.signal_type}, ref {approval.ref})"
        )
    return "none"
