"""A decision about an instance, and writing it: the row, its history record, its events.

One :func:`write` is one transaction's worth: the instance row is updated, an append-only
history record is inserted and published as an event through the outbox, and timers are
scheduled, all in the caller's transaction, so a transition exists exactly when its record and
its event do.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from cloudevents.core.v1.event import CloudEvent
from outboxkit.outbox.secrecy import redact
from outboxkit.outbox.writer import Outbox
from outboxkit.workflows import store
from outboxkit.workflows.events import transition_event
from outboxkit.workflows.records import (
    TERMINAL,
    Approval,
    CompensationEntry,
    Status,
    WaitSpec,
    WorkflowRecord,
)

KEEP: Any = object()
"""A :class:`Change` field left as the instance has it."""


@dataclass
class Change:
    """What one decision does to an instance, and what its history record says."""

    kind: str
    to_state: str
    status: Status
    trigger: dict[str, Any]
    actor: str
    decision: Any = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    observations: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None
    unknown: str | None = None
    versions: dict[str, str] | None = None
    data: dict[str, Any] | None = None
    run_at_ms: int | None = None
    wait: WaitSpec | None = None
    approval: Approval | None = KEEP
    approval_ref: str | None = None
    compensations: list[CompensationEntry] = KEEP
    after_compensation: str | None = KEEP
    review_from: str | None = KEEP
    failure_class: str | None = None
    last_error: str | None = None
    open_unknown: str | None = None
    attempt: int = 1
    events: list[tuple[CloudEvent, str, dt.datetime | None]] = field(default_factory=list)
    """More events for the outbox: (event, topic, deliver_at)."""


@dataclass(frozen=True)
class Sink:
    """Where an engine's events go: the outbox, its two topics, its CloudEvents source."""

    outbox: Outbox
    events_topic: str
    signals_topic: str
    source: str
    redact_keys: tuple[str, ...] = ()


async def write(
    session: Any, sink: Sink, current: WorkflowRecord, change: Change, now_ms: int
) -> WorkflowRecord:
    """Apply ``change`` to ``current`` (read under its row lock in this transaction).

    Returns the instance as written. The lease is released: the next step of the instance is
    claimed afresh.
    """
    seq = current.seq + 1
    entered = change.to_state != current.state or change.kind in (
        "resume",
        "operator",
        "approval_stale",
    )
    data = current.data if change.data is None else change.data
    redact_keys = sink.redact_keys
    values: dict[str, Any] = {
        "state": change.to_state,
        "status": Status.DONE.value if change.to_state in TERMINAL else change.status.value,
        "data": store.dumps(data),
        "run_at_ms": change.run_at_ms,
        "wait": None if change.wait is None else store.dumps(change.wait.to_json()),
        "wait_deadline_ms": None if change.wait is None else change.wait.deadline_ms,
        "correlation": None if change.wait is None else change.wait.correlation,
        "lease_holder": None,
        "lease_expires_ms": None,
        "attempts": 0,
        "first_failure_ms": None,
        "failure_class": change.failure_class,
        "last_error": change.last_error,
        "open_unknown": change.open_unknown,
        "seq": seq,
        "entered_seq": seq if entered else current.entered_seq,
        "state_since_ms": now_ms if change.to_state != current.state else current.state_since_ms,
        "updated_ms": now_ms,
    }
    if change.approval is not KEEP:
        values["approval"] = (
            None if change.approval is None else store.dumps(change.approval.to_json())
        )
    if change.compensations is not KEEP:
        values["compensations"] = store.dumps([entry.to_json() for entry in change.compensations])
    if change.after_compensation is not KEEP:
        values["after_compensation"] = change.after_compensation
    if change.review_from is not KEEP:
        values["review_from"] = change.review_from
    await store.update_instance(session, current.id, values)
    record = {
        "seq": seq,
        "name": current.name,
        "version": current.version,
        "kind": change.kind,
        "from_state": current.state or None,
        "to_state": change.to_state,
        "trigger": redact(change.trigger, redact_keys),
        "decision": redact(change.decision, redact_keys),
        "steps": redact(change.steps, redact_keys),
        "observations": redact(change.observations, redact_keys),
        "result": redact(change.result, redact_keys),
        "unknown": change.unknown,
        "approval_ref": change.approval_ref,
        "versions": change.versions,
        "attempt": change.attempt,
        "deadline_ms": None if change.wait is None else change.wait.deadline_ms,
        "actor": change.actor[:128],
        "at_ms": now_ms,
    }
    await store.append_history(
        session,
        {
            **{key: value for key, value in record.items()},
            "tenant": current.tenant,
            "workflow_id": current.workflow_id,
            "trigger": store.dumps(record["trigger"]),
            "decision": None if record["decision"] is None else store.dumps(record["decision"]),
            "steps": store.dumps(record["steps"]),
            "observations": store.dumps(record["observations"]),
            "result": None if record["result"] is None else store.dumps(record["result"]),
            "versions": None if change.versions is None else store.dumps(change.versions),
            "data": store.dumps(redact(data, redact_keys)),
        },
    )
    published = {**record, "workflow_id": current.workflow_id, "tenant": current.tenant}
    event = transition_event(sink.source, current.tenant, current.workflow_id, seq, published)
    await sink.outbox.add_async(session, event, topic=sink.events_topic)
    for extra, topic, deliver_at in change.events:
        await sink.outbox.add_async(session, extra, topic=topic, deliver_at=deliver_at)
    if values["status"] == Status.RUNNABLE.value:
        await store.notify(session, current.workflow_id)
    written = await store.get(session, current.tenant, current.workflow_id)
    assert written is not None
    return written
