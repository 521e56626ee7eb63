"""Reading workflows for operators: what ``outboxkit workflows list`` and ``show`` print.

Everything here reads; nothing decides. Cancel, resume and escalate go through the engine
(:class:`~outboxkit.workflows.WorkflowEngine`), which knows the definitions. Ages and deadlines
are measured against ``now_ms`` (epoch ms), the same clock the engine writes its times with.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from outboxkit.actions.records import OperationRecord
from outboxkit.actions.store import ActionStore
from outboxkit.ops.formatting import format_age, format_ms
from outboxkit.outbox.secrecy import redact
from outboxkit.workflows import WorkflowEngine, store
from outboxkit.workflows.records import (
    COMPENSATING,
    HUMAN_REVIEW,
    HistoryRecord,
    SignalRecord,
    Status,
    WorkflowRecord,
)
from outboxkit.workflows.tables import workflow_instances
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

BAD_KINDS = frozenset({"failure", "unknown", "compensation_failed"})
"""History kinds that are not a good transition (the last good one is shown apart)."""

AWAITING, RESUMING, APPROVED, NONE = "awaiting", "resuming", "approved", "none"


async def list_workflows(
    session: AsyncSession,
    *,
    now_ms: int,
    tenant: str | None = None,
    name: str | None = None,
    states: Sequence[str] = (),
    stuck_after_ms: int | None = None,
    limit: int = 100,
    tenants: Collection[str] | None = None,
    before: tuple[int, int] | None = None,
    after: tuple[int, int] | None = None,
) -> list[WorkflowRecord]:
    """Instances, most recently changed first, filtered by tenant, name and states (and with
    ``tenants``, to those tenants); ``before``: the ``(updated_ms, id)`` the previous page
    ended with (keyset paging).

    With ``stuck_after_ms``: only work that has been due at least that long and is not taken
    forward (runnable past ``run_at``, or waiting past its deadline, including a step whose
    worker holds it that long or died holding it), oldest due first; ``after``: the
    ``(due_ms, id)`` the previous page ended with (:func:`page_keyset` of its last record).
    """
    due_before_ms = None if stuck_after_ms is None else now_ms - stuck_after_ms
    return await store.list_instances(
        session,
        tenant=tenant,
        name=name,
        states=states,
        due_before_ms=due_before_ms,
        limit=limit,
        tenants=tenants,
        before=before,
        after=after,
    )


def page_keyset(record: WorkflowRecord, *, stuck: bool) -> str:
    """The keyset the next page starts after, as ``VALUE.ID``: ``(due_ms, id)`` in the stuck
    filter, ``(updated_ms, id)`` otherwise."""
    due = store.due_keyset(record) if stuck else None
    value, id_ = due if due is not None else (record.updated_ms, record.id)
    return f"{value}.{id_}"


def approval_status(record: WorkflowRecord) -> str:
    """``awaiting`` an approval bound to a request hash, ``resuming`` (one was accepted and a
    worker has still to take it), ``approved`` (the instance holds one), or ``none``."""
    if record.wait is not None and record.wait.request_hash is not None:
        return AWAITING if record.status is Status.WAITING else RESUMING
    return APPROVED if record.approval is not None else NONE


def deadline(record: WorkflowRecord) -> tuple[int | None, str | None]:
    """The deadline that applies now: the wait's (``wait``) or the whole run's (``run``)."""
    if record.wait is not None:
        return record.wait.deadline_ms, "wait"
    if record.deadline_ms is not None and not record.terminal:
        return record.deadline_ms, "run"
    return None, None


def summary(record: WorkflowRecord, now_ms: int) -> dict[str, Any]:
    """One instance as a line of ``workflows list`` (the JSON form; times in epoch ms)."""
    deadline_ms, deadline_kind = deadline(record)
    runnable = record.status is Status.RUNNABLE
    return {
        "tenant": record.tenant,
        "workflow_id": record.workflow_id,
        "name": record.name,
        "version": record.version,
        "state": record.state,
        "status": record.status.value,
        "age_ms": max(0, now_ms - record.created_ms),
        "in_state_ms": max(0, now_ms - record.state_since_ms),
        "deadline_ms": deadline_ms,
        "deadline_kind": deadline_kind,
        "owner": record.owner,
        "attempts": record.attempts,
        "next_run_ms": record.run_at_ms if runnable else None,
        "backoff_ms": max(0, record.run_at_ms - now_ms)
        if runnable and record.run_at_ms is not None and record.attempts
        else None,
        "leased_by": record.lease_holder,
        "failure_class": record.failure_class,
        "open_unknown": record.open_unknown,
        "approval": approval_status(record),
        "cancel_requested_ms": record.cancel_requested_ms,
    }


def last_good(history: Sequence[HistoryRecord]) -> HistoryRecord | None:
    """The last history record that is not a failure, an unknown or a failed compensation."""
    return next((h for h in reversed(history) if h.kind not in BAD_KINDS), None)


def next_action(record: WorkflowRecord, now_ms: int, max_attempts: int | None = None) -> str:
    """What happens next to the instance, and what an operator may do, in one line."""
    if record.terminal:
        return f"none: it ended in {record.state}"
    if record.state == HUMAN_REVIEW:
        back = record.review_from or "?"
        unknown = (
            f"resolve operation {record.open_unknown!r} first (outboxkit actions resolve); "
            if record.open_unknown
            else ""
        )
        cancel = " (a cancel is asked for)" if record.cancel_requested_ms is not None else ""
        return f"human_review: {unknown}resume [--to STATE] (default {back}), cancel{cancel}"
    if record.cancel_requested_ms is not None and record.state != COMPENSATING:
        return (
            f"cancel asked at {format_ms(record.cancel_requested_ms)}: a worker unwinds it "
            "at its next step"
        )
    if record.state == COMPENSATING:
        left = len(record.compensations)
        then = record.after_compensation or "failed"
        return f"compensating: {left} compensation{'s' if left != 1 else ''} left, then {then}"
    if record.status is Status.WAITING and record.wait is not None:
        wait = record.wait
        sources = ", ".join(wait.sources) if wait.sources else "any authenticated source"
        return (
            f"waiting for {'|'.join(sorted(wait.on))} from {sources} until "
            f"{format_ms(wait.deadline_ms)}, then {wait.on_deadline}"
        )
    run_at = record.run_at_ms if record.run_at_ms is not None else now_ms
    if record.lease_holder is not None:
        return f"running {record.state} on worker {record.lease_holder}"
    when = "now" if run_at <= now_ms else f"at {format_ms(run_at)}"
    if record.open_unknown is not None:
        return f"reconcile operation {record.open_unknown!r} {when}, then run {record.state} again"
    if record.attempts:
        of = f" of {max_attempts}" if max_attempts is not None else ""
        return f"retry {record.state} {when} (attempt {record.attempts + 1}{of})"
    if record.wait is not None:
        return f"resume from its wait in {record.state} {when} (a signal was accepted)"
    return f"run {record.state} {when}"


def effects(history: Sequence[HistoryRecord]) -> list[dict[str, Any]]:
    """The keyed steps the history records: seq, action type, key, executed, external ref."""
    return [
        {
            "seq": record.seq,
            "action_type": step.get("action_type"),
            "key": step.get("key"),
            "executed": step.get("executed"),
            "external_ref": step.get("external_ref"),
        }
        for record in history
        for step in record.steps
    ]


@dataclass(frozen=True)
class WorkflowReport:
    """Everything ``workflows show`` prints about one instance."""

    record: WorkflowRecord
    history: list[HistoryRecord]
    signals: list[SignalRecord]
    unknowns: list[tuple[str, OperationRecord | None]]
    """Every operation key ever left unknown (open or in the history), with its ledger row."""
    now_ms: int
    max_attempts: int | None = None
    redact_keys: tuple[str, ...] = ()
    """The definitions' ``redact_keys`` (when the application is known): hidden like secrets."""

    @property
    def last_good(self) -> HistoryRecord | None:
        """The last good transition."""
        return last_good(self.history)

    @property
    def next_action(self) -> str:
        """What happens next, and what an operator may do."""
        return next_action(self.record, self.now_ms, self.max_attempts)

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``workflows show --json``): the instance's data, approval and
        compensations redacted (:func:`~outboxkit.outbox.secrecy.redact`), as in the text."""
        good = self.last_good
        record = self.record
        return {
            "summary": summary(record, self.now_ms),
            "next_action": self.next_action,
            "last_good": None if good is None else _history_line(good),
            "pending_step": pending_step(record),
            "approval": None if record.approval is None else record.approval.to_json(),
            "awaiting_request_hash": None if record.wait is None else record.wait.request_hash,
            "effects": effects(self.history),
            "unknowns": [
                {
                    "key": key,
                    "open": key == record.open_unknown,
                    "state": None if op is None else op.state.value,
                    "action_type": None if op is None else op.action_type,
                    "last_error": None if op is None else op.last_error,
                }
                for key, op in self.unknowns
            ],
            "history": [_history_line(h) for h in self.history],
            "signals": [
                {
                    "type": s.type,
                    "source": s.source,
                    "id": s.event_id,
                    "outcome": s.outcome,
                    "reason": s.reason,
                    "received_ms": s.received_ms,
                }
                for s in self.signals
            ],
            "instance": redact(record.to_json(), self.redact_keys),
        }


def pending_step(record: WorkflowRecord) -> dict[str, Any] | None:
    """The step still to take (in human_review: the state it came from), with its failures so
    far; ``None`` once ended."""
    if record.terminal:
        return None
    return {
        "state": record.review_from if record.state == HUMAN_REVIEW else record.state,
        "attempts": record.attempts,
        "failure_class": record.failure_class,
        "last_error": record.last_error,
        "open_unknown": record.open_unknown,
        "first_failure_ms": record.first_failure_ms,
        "run_at_ms": record.run_at_ms if record.status is Status.RUNNABLE else None,
        "leased_by": record.lease_holder,
        "lease_expires_ms": record.lease_expires_ms,
    }


def short_decision(record: HistoryRecord, width: int = 60) -> str:
    """The decision, or the failure's error, in at most ``width`` characters."""
    value = record.decision
    if isinstance(value, dict):
        text = ", ".join(f"{k}={v}" for k, v in value.items())
    else:
        text = "" if value is None else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _history_line(record: HistoryRecord) -> dict[str, Any]:
    return {
        "seq": record.seq,
        "at_ms": record.at_ms,
        "kind": record.kind,
        "from": record.from_state,
        "to": record.to_state,
        "actor": record.actor,
        "attempt": record.attempt,
        "decision": short_decision(record),
        "approval_ref": record.approval_ref,
        "unknown": record.unknown,
    }


async def describe(
    session: AsyncSession,
    tenant: str,
    workflow_id: str,
    *,
    now_ms: int,
    max_attempts: int | None = None,
) -> WorkflowReport | None:
    """The report on one instance, or ``None`` if it does not exist."""
    record = await store.get(session, tenant, workflow_id)
    if record is None:
        return None
    history = await store.history(session, tenant, workflow_id)
    keys = [h.unknown for h in history if h.unknown] + (
        [record.open_unknown] if record.open_unknown else []
    )
    ledger = ActionStore()
    unknowns = [(key, await ledger.get(session, tenant, key)) for key in dict.fromkeys(keys)]
    signals = await store.signals(session, tenant, workflow_id)
    return WorkflowReport(record, history, signals, unknowns, now_ms, max_attempts)


def age_text(now_ms: int, epoch_ms: int | None) -> str:
    """``in 5m00s`` for a time ahead, ``3s ago`` for one past, ``-`` for none."""
    if epoch_ms is None:
        return "-"
    if epoch_ms >= now_ms:
        return f"in {format_age(epoch_ms - now_ms)}"
    return f"{format_age(now_ms - epoch_ms)} ago"


async def state_counts(session: AsyncSession) -> dict[tuple[str, str], int]:
    """How many instances are in each ``(state, status)``."""
    table = workflow_instances
    rows = await session.execute(
        select(table.c.state, table.c.status, func.count()).group_by(table.c.state, table.c.status)
    )
    return {(row[0], row[1]): int(row[2]) for row in rows}


async def decide(
    engine: WorkflowEngine, work: Callable[[AsyncSession], Awaitable[WorkflowRecord]]
) -> WorkflowRecord:
    """Run an operator's decision (``engine.cancel``, ``resume``, ``escalate``) in one
    transaction of the engine's database."""
    async with engine.sessions() as session, session.begin():
        return await work(session)
