"""The CloudEvent written through the outbox for each state change of an operation.

Its id is derived from the operation and the transition, never from wall time:
``{tenant}/{key}/g{generation}/a{attempt}/{from}>{to}``. A retried call that repeats a
transition therefore produces the same ``(source, id)``, which the outbox ignores. Events carry
no parameters and no result (they may hold personal data or secrets): only their hash, the
states, the external reference and a short reason.

The data of each event type is a pydantic model (:class:`ActionSucceeded`, ...), so a consumer
declares ``async def on_refund(event: ActionSucceeded, session)``; every key is always present
(``external_ref`` and ``from`` as ``null`` when there is none). :func:`event_schemas` gives their
JSON schemas, which ``docs/agent-actions.md`` shows.
"""

from __future__ import annotations

from typing import Any, Literal

from cloudevents.core.v1.event import CloudEvent
from outboxkit.actions.records import OperationRecord
from outboxkit.actions.states import State
from outboxkit.outbox.events import new_event
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

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


class ActionEventData(BaseModel):
    """The data of every action event: which operation changed, from what to what, and why.

    No parameters and no result: only their hash. Subclasses narrow ``to`` per event type.
    """

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    tenant: str
    key: str = Field(description="The operation key (also the event's subject and Kafka key).")
    generation: int = Field(description="Starts at 1; + 1 each time an expired key is reused.")
    attempt: int = Field(description="The attempt of the generation (0 before the first claim).")
    action_type: str
    params_hash: str = Field(description="SHA-256 hex of the canonical JSON parameters.")
    from_state: State | None = Field(alias="from", description="null for a new operation.")
    to: State
    by: str = Field(description="The lease holder, reconciler or operator that made the change.")
    reason: str = Field(max_length=MAX_REASON)
    needs_attention: bool
    external_ref: str | None = Field(description="The external system's reference, or null.")


class ActionRequested(ActionEventData):
    """``outboxkit.action.requested``: a new operation, or a new generation of an expired one."""

    to: Literal[State.PENDING]


class ActionStarted(ActionEventData):
    """``outboxkit.action.started``: a worker claimed an attempt under a lease."""

    to: Literal[State.RUNNING]


class ActionSucceeded(ActionEventData):
    """``outboxkit.action.succeeded``: the worker recorded success."""

    to: Literal[State.SUCCEEDED]


class ActionFailed(ActionEventData):
    """``outboxkit.action.failed``: for good (FAILED_FINAL), or transiently (back to PENDING)."""

    to: Literal[State.FAILED_FINAL, State.PENDING]


class ActionUnknown(ActionEventData):
    """``outboxkit.action.unknown``: the outcome may or may not have happened."""

    to: Literal[State.UNKNOWN]


class ActionReconciled(ActionEventData):
    """``outboxkit.action.reconciled``: an UNKNOWN operation resolved (reconciler or person)."""

    to: Literal[State.SUCCEEDED, State.PENDING, State.FAILED_FINAL]


class ActionFlagged(ActionEventData):
    """``outboxkit.action.flagged``: still UNKNOWN, flagged for a person (``needs_attention``)."""

    to: Literal[State.UNKNOWN]


EVENT_MODELS: dict[str, type[ActionEventData]] = {
    REQUESTED: ActionRequested,
    STARTED: ActionStarted,
    SUCCEEDED: ActionSucceeded,
    FAILED: ActionFailed,
    UNKNOWN: ActionUnknown,
    RECONCILED: ActionReconciled,
    FLAGGED: ActionFlagged,
}
"""The data model of each event type."""


def event_schemas() -> dict[str, Any]:
    """The JSON schemas of the event data models, one document with a ``$defs`` entry each."""
    _, schema = models_json_schema(
        [(model, "validation") for model in EVENT_MODELS.values()],
        title="outboxkit action event data",
    )
    return schema


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
    data = EVENT_MODELS[event_type](
        tenant=operation.tenant,
        key=operation.key,
        generation=operation.generation,
        attempt=attempt,
        action_type=operation.action_type,
        params_hash=operation.params_hash,
        from_state=from_state,
        to=to,
        by=actor,
        reason=reason[:MAX_REASON],
        needs_attention=operation.needs_attention,
        external_ref=operation.external_ref,
    )
    return new_event(
        event_type,
        source,
        data.model_dump(mode="json", by_alias=True),
        id=event_id(operation.tenant, operation.key, operation.generation, attempt, from_state, to),
        subject=operation.key,
        partitionkey=operation.key,
    )
