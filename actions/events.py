"""The CloudEvent written through the outbox for each state change of an operation.

Its id is derived from the operation and the transition, never from wall time:
``{tenant}/{key}/g{generation}/a{attempt}/{from}>{to}``. A retried call that repeats a
transition therefore produces the same ``(source, id)``, which the outbox ignores. Events carry
no parameters and no result (they may hold personal data or secrets): only their hash, the
states, the external reference and a short reason.
"""

from __future__ import annotations

from typing import Any

from cloudevents.core.v1.event import CloudEvent
from outboxkit.actions.records import OperationRecord
from outboxkit.actions.states import State
from outboxkit.outbox.events import new_event

EVENT_PREFIX = "outboxkit.action."
REQUESTED = EVENT_PREFIX + "requested"
STARTED = EVENT_PREFIX + "started"
SUCCEEDED = EVENT_PREFIX + "succeeded"
FAILED = EVENT_PREFIX + "failed"
UNKNOWN = EVENT_PREFIX + "unknown"
RECONCILED = EVENT_PREFIX + "reconciled"
FLAGGED = EVENT_PREFIX + "flagged"
DEFAULT_SOURCE = "/outboxkit/actions"
DEFAULT_TOPIC = "outboxkit.actions"
MAX_REASON = 300


def event_id(
    tenant: str, key: str, generation: int, attempt: int, from_state: State | None, to: State
) -> str:
    """The deterministic event id of one transition of one operation."""
    return f"{tenant}/{key}/g{generation}/a{attempt}/{from_state or 'NEW'}>{to}"


def transition_event(
    *,
    source: str,
    event_type: str,
    operation: OperationRecord,
    attempt: int,
    from_state: State | None,
    to: State,
    actor: str,
    reason: str,
) -> CloudEvent:
    """Build the event of ``from_state -> to`` for ``operation`` (its state after the change)."""
    data: dict[str, Any] = {
        "tenant": operation.tenant,
        "key": operation.key,
        "generation": operation.generation,
        "attempt": attempt,
        "action_type": operation.action_type,
        "params_hash": operation.params_hash,
        "from": from_state.value if from_state else None,
        "to": to.value,
        "by": actor,
        "reason": reason[:MAX_REASON],
        "needs_attention": operation.needs_attention,
    }
    if operation.external_ref is not None:
        data["external_ref"] = operation.external_ref
    return new_event(
        event_type,
        source,
        data,
        id=event_id(operation.tenant, operation.key, operation.generation, attempt, from_state, to),
        subject=operation.key,
        partitionkey=operation.key,
    )
