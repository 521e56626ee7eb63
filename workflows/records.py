"""Plain values read from the workflow tables: instances, history records, signals."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from outboxkit.outbox.jsonable import as_json


class Status(StrEnum):
    """Whether an instance has work to do now."""

    RUNNABLE = "runnable"
    """A worker should run its state (at ``run_at_ms``), or resume it from a signal."""
    WAITING = "waiting"
    """Waiting durably for a signal, its deadline, or (in human_review) a person."""
    DONE = "done"
    """In a terminal state."""


TERMINAL = frozenset({"complete", "rejected", "cancelled", "expired", "failed"})
"""States a workflow never leaves."""
HUMAN_REVIEW = "human_review"
COMPENSATING = "compensating"
BUILT_IN = TERMINAL | {HUMAN_REVIEW, COMPENSATING}
"""States every definition has; their handling is the engine's."""


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


@dataclass(frozen=True, slots=True)
class WaitSpec:
    """A wait as stored: what may resume the instance, and until when."""

    on: dict[str, str]
    sources: list[str]
    correlation: str
    deadline_ms: int
    on_deadline: str
    remind_every_ms: int | None
    request_hash: str | None
    started_ms: int
    timer_secret: str = ""
    """The key (hex) the wait's timers are signed with; only this row holds it. A wait stored
    before timers were signed has none: its timers are refused (its deadline still applies)."""

    def to_json(self) -> dict[str, Any]:
        """The stored JSON form."""
        return as_json(self)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> WaitSpec:
        """Read the stored JSON form."""
        return cls(**value)


@dataclass(frozen=True, slots=True)
class Approval:
    """An accepted approval: the request hash it covers, who gave it, and its reference."""

    state: str
    request_hash: str
    signal_type: str
    principal: str | None
    ref: str

    def to_json(self) -> dict[str, Any]:
        """The stored JSON form."""
        return as_json(self)


@dataclass(frozen=True, slots=True)
class CompensationEntry:
    """A done effect's compensation, kept until it ran: the undo's name, key and parameters."""

    name: str
    effect_key: str
    params: Any
    authorised_by: str
    round: int = 0
    """Raised by an operator's resume after this compensation failed for good: a new try."""

    @property
    def key(self) -> str:
        """The compensation's own operation key (at most once, like every step)."""
        suffix = ":undo" if self.round == 0 else f":undo:r{self.round}"
        return f"{self.effect_key[: 128 - len(suffix)]}{suffix}"

    def to_json(self) -> dict[str, Any]:
        """The stored JSON form."""
        return as_json(self)


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    """One row of ``workflow_instances`` as the database last showed it."""

    id: int
    tenant: str
    workflow_id: str
    name: str
    version: int
    state: str
    status: Status
    input_hash: str
    data: dict[str, Any]
    owner: str | None
    run_at_ms: int | None
    wait: WaitSpec | None
    wait_deadline_ms: int | None
    correlation: str | None
    lease_holder: str | None
    lease_expires_ms: int | None
    attempts: int
    first_failure_ms: int | None
    failure_class: str | None
    last_error: str | None
    open_unknown: str | None
    approval: Approval | None
    compensations: list[CompensationEntry]
    after_compensation: str | None
    review_from: str | None
    cancel_requested_ms: int | None
    cancel_reason: str | None
    deadline_ms: int | None
    seq: int
    entered_seq: int
    state_since_ms: int
    created_ms: int
    updated_ms: int

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> WorkflowRecord:
        """Build a record from a row mapping of ``workflow_instances``."""
        wait = _json(row["wait"])
        approval = _json(row["approval"])
        return cls(
            id=row["id"],
            tenant=row["tenant"],
            workflow_id=row["workflow_id"],
            name=row["name"],
            version=row["version"],
            state=row["state"],
            status=Status(row["status"]),
            input_hash=row["input_hash"],
            data=json.loads(row["data"]),
            owner=row["owner"],
            run_at_ms=row["run_at_ms"],
            wait=None if wait is None else WaitSpec.from_json(wait),
            wait_deadline_ms=row["wait_deadline_ms"],
            correlation=row["correlation"],
            lease_holder=row["lease_holder"],
            lease_expires_ms=row["lease_expires_ms"],
            attempts=row["attempts"],
            first_failure_ms=row["first_failure_ms"],
            failure_class=row["failure_class"],
            last_error=row["last_error"],
            open_unknown=row["open_unknown"],
            approval=None if approval is None else Approval(**approval),
            compensations=[CompensationEntry(**c) for c in json.loads(row["compensations"])],
            after_compensation=row["after_compensation"],
            review_from=row["review_from"],
            cancel_requested_ms=row["cancel_requested_ms"],
            cancel_reason=row["cancel_reason"],
            deadline_ms=row["deadline_ms"],
            seq=row["seq"],
            entered_seq=row["entered_seq"],
            state_since_ms=row["state_since_ms"],
            created_ms=row["created_ms"],
            updated_ms=row["updated_ms"],
        )

    @property
    def terminal(self) -> bool:
        """True in a state the workflow never leaves."""
        return self.state in TERMINAL

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the CLI's ``--json``); the row id stays inside."""
        return as_json(self, omit={"id"})


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    """One row of the append-only ``workflow_history``: a transition and why it happened."""

    seq: int
    name: str
    version: int
    kind: str
    from_state: str | None
    to_state: str
    trigger: dict[str, Any]
    decision: Any
    steps: list[dict[str, Any]]
    observations: list[dict[str, Any]]
    result: Any
    unknown: str | None
    approval_ref: str | None
    versions: dict[str, str] | None
    data: dict[str, Any]
    attempt: int
    deadline_ms: int | None
    actor: str
    at_ms: int

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> HistoryRecord:
        """Build a record from a row mapping of ``workflow_history``."""
        return cls(
            seq=row["seq"],
            name=row["name"],
            version=row["version"],
            kind=row["kind"],
            from_state=row["from_state"],
            to_state=row["to_state"],
            trigger=json.loads(row["trigger"]),
            decision=_json(row["decision"]),
            steps=json.loads(row["steps"]),
            observations=json.loads(row["observations"]),
            result=_json(row["result"]),
            unknown=row["unknown"],
            approval_ref=row["approval_ref"],
            versions=_json(row["versions"]),
            data=json.loads(row["data"]),
            attempt=row["attempt"],
            deadline_ms=row["deadline_ms"],
            actor=row["actor"],
            at_ms=row["at_ms"],
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, with the short names ``from`` and ``to``."""
        return as_json(self, rename={"from_state": "from", "to_state": "to"})


@dataclass(frozen=True, slots=True)
class SignalRecord:
    """One row of ``workflow_signals``: an event addressed to an instance, and what became of it.

    ``outcome``: ``pending`` (kept until the instance waits for it), ``accepted`` (it will
    resume the instance), ``consumed`` (it did, at history ``consumed_seq``), ``rejected``
    (wrong source, correlation, signature or request hash: ``reason`` says which), ``late``
    (its wait had ended).
    """

    source: str
    event_id: str
    type: str
    correlation: str | None
    request_hash: str | None
    principal: str | None
    data: Any
    outcome: str
    reason: str | None
    received_ms: int
    consumed_seq: int | None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> SignalRecord:
        """Build a record from a row mapping of ``workflow_signals``."""
        return cls(
            source=row["source"],
            event_id=row["event_id"],
            type=row["type"],
            correlation=row["correlation"],
            request_hash=row["request_hash"],
            principal=row["principal"],
            data=_json(row["data"]),
            outcome=row["outcome"],
            reason=row["reason"],
            received_ms=row["received_ms"],
            consumed_seq=row["consumed_seq"],
        )

    @property
    def ref(self) -> str:
        """``source/id``: how the history refers to it."""
        return f"{self.source}/{self.event_id}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the CLI's ``--json``)."""
        return as_json(self)
