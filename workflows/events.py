"""The CloudEvents the engine writes through the outbox: transitions, timers and reminders.

Every history record is published as ``outboxkit.workflow.transitioned`` in the transaction that
writes it, with the deterministic id ``{tenant}/{workflow_id}/{seq}`` and the workflow id as
partition key, so one workflow's transitions arrive in order. Timers are scheduled events
(``deliver_at``) on the signals topic that come back to the engine through its consumer.
"""

from __future__ import annotations

from typing import Any

from cloudevents.core.v1.event import CloudEvent
from outboxkit.outbox.events import new_event
from outboxkit.workflows.signatures import (
    CORRELATION_EXTENSION,
    TENANT_EXTENSION,
    WORKFLOW_EXTENSION,
)

TRANSITIONED = "outboxkit.workflow.transitioned"
TIMER = "outboxkit.workflow.timer"
REMINDER = "outboxkit.workflow.reminder"


def transition_event(
    source: str, tenant: str, workflow_id: str, seq: int, data: dict[str, Any]
) -> CloudEvent:
    """The event of history record ``seq`` (``data``: the record, redacted, without ``data``)."""
    return new_event(
        TRANSITIONED,
        source,
        data,
        id=f"{tenant}/{workflow_id}/{seq}",
        subject=workflow_id,
        partitionkey=workflow_id,
        extensions={WORKFLOW_EXTENSION: workflow_id, TENANT_EXTENSION: tenant},
    )


def timer_event(
    source: str, tenant: str, workflow_id: str, correlation: str, kind: str, number: int = 0
) -> CloudEvent:
    """A timer of the wait ``correlation``: ``deadline``, or reminder number ``number``."""
    return new_event(
        TIMER,
        source,
        {"kind": kind, "number": number},
        id=f"{tenant}/{correlation}/{kind}/{number}",
        subject=workflow_id,
        partitionkey=workflow_id,
        extensions={
            WORKFLOW_EXTENSION: workflow_id,
            TENANT_EXTENSION: tenant,
            CORRELATION_EXTENSION: correlation,
        },
    )


def reminder_event(
    source: str, tenant: str, workflow_id: str, correlation: str, number: int, data: dict[str, Any]
) -> CloudEvent:
    """Reminder number ``number`` that the wait ``correlation`` is still open.

    Its id differs from the id of the timer that asked for it (same source): the outbox keeps
    one row per ``(source, id)``, so a shared id would drop the reminder silently.
    """
    return new_event(
        REMINDER,
        source,
        data,
        id=f"{tenant}/{correlation}/reminded/{number}",
        subject=workflow_id,
        partitionkey=workflow_id,
        extensions={
            WORKFLOW_EXTENSION: workflow_id,
            TENANT_EXTENSION: tenant,
            CORRELATION_EXTENSION: correlation,
        },
    )
