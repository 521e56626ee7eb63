"""The CloudEvents the engine writes through the outbox: transitions, timers and reminders.

Every history record is published as ``outboxkit.workflow.transitioned`` in the transaction that
writes it, with the deterministic id ``{tenant}/{workflow_id}/{seq}`` and the workflow id as
partition key, so one workflow's transitions arrive in order. Timers are scheduled events
(``deliver_at``) on the signals topic that come back to the engine through its consumer.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from cloudevents.core.v1.event import CloudEvent
from outboxkit.outbox.events import new_event
from outboxkit.workflows.records import WaitSpec
from outboxkit.workflows.signatures import (
    CORRELATION_EXTENSION,
    SIGNATURE_EXTENSION,
    TENANT_EXTENSION,
    WORKFLOW_EXTENSION,
    sign,
)

TRANSITIONED = "outboxkit.workflow.transitioned"
TIMER = "outboxkit.workflow.timer"
REMINDER = "outboxkit.workflow.reminder"


def id_part(text: str) -> str:
    """``text`` as one ``/``-separated part of an event id: ``%`` and ``/`` percent-escaped.

    Tenants and workflow ids are the caller's strings; unescaped, tenant ``a/b`` with workflow
    ``c`` and tenant ``a`` with workflow ``b/c`` had one event id, and the outbox keeps one
    event per ``(source, id)``. Text without ``%`` or ``/`` is unchanged.
    """
    return text.replace("%", "%25").replace("/", "%2F")


def transition_event(
    source: str, tenant: str, workflow_id: str, seq: int, data: dict[str, Any]
) -> CloudEvent:
    """The event of history record ``seq`` (``data``: the record, redacted, without ``data``)."""
    return new_event(
        TRANSITIONED,
        source,
        data,
        id=f"{id_part(tenant)}/{id_part(workflow_id)}/{seq}",
        subject=workflow_id,
        partitionkey=workflow_id,
        extensions={WORKFLOW_EXTENSION: workflow_id, TENANT_EXTENSION: tenant},
    )


def timer_event(
    source: str,
    tenant: str,
    workflow_id: str,
    correlation: str,
    kind: str,
    number: int = 0,
    *,
    secret: str,
) -> CloudEvent:
    """A timer of the wait ``correlation``: ``deadline``, or reminder number ``number``.

    It is signed (``authsig``) with the wait's own ``secret`` (:attr:`WaitSpec.timer_secret`),
    which only the instance's row holds: the engine takes a timer only when it verifies.
    """
    data = {"kind": kind, "number": number}
    event_id = f"{id_part(tenant)}/{id_part(correlation)}/{kind}/{number}"
    extensions = {
        WORKFLOW_EXTENSION: workflow_id,
        TENANT_EXTENSION: tenant,
        CORRELATION_EXTENSION: correlation,
    }
    signature = sign(
        bytes.fromhex(secret) if secret else b"",
        source=source,
        id=event_id,
        type=TIMER,
        extensions=extensions,
        data=data,
    )
    return new_event(
        TIMER,
        source,
        data,
        id=event_id,
        subject=workflow_id,
        partitionkey=workflow_id,
        extensions={**extensions, SIGNATURE_EXTENSION: signature},
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
        id=f"{id_part(tenant)}/{id_part(correlation)}/reminded/{number}",
        subject=workflow_id,
        partitionkey=workflow_id,
        extensions={
            WORKFLOW_EXTENSION: workflow_id,
            TENANT_EXTENSION: tenant,
            CORRELATION_EXTENSION: correlation,
        },
    )


Scheduled = tuple[CloudEvent, str, dt.datetime]
"""An event for the outbox, its topic and the instant it is due (``deliver_at``)."""


def deadline_timer(
    source: str, topic: str, tenant: str, workflow_id: str, wait: WaitSpec
) -> Scheduled:
    """The timer that wakes the wait ``wait`` at its deadline."""
    event = timer_event(
        source, tenant, workflow_id, wait.correlation, "deadline", secret=wait.timer_secret
    )
    return event, topic, instant(wait.deadline_ms)


def reminder_timer(
    source: str, topic: str, tenant: str, workflow_id: str, wait: WaitSpec, number: int
) -> Scheduled | None:
    """Reminder timer ``number`` of ``wait`` (due ``number`` periods after it began), or
    ``None`` if the wait has no reminders or that one would not come before the deadline."""
    if wait.remind_every_ms is None:
        return None
    at_ms = wait.started_ms + number * wait.remind_every_ms
    if at_ms >= wait.deadline_ms:
        return None
    event = timer_event(
        source, tenant, workflow_id, wait.correlation, "reminder", number, secret=wait.timer_secret
    )
    return event, topic, instant(at_ms)


def instant(epoch_ms: int) -> dt.datetime:
    """An epoch-milliseconds time of the engine's clock as a timezone-aware UTC instant."""
    return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC)
