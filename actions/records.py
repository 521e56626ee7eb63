"""Plain values the store hands out: operations, audit entries, leases, decisions, outcomes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from outboxkit.actions.states import State
from outboxkit.outbox.jsonable import as_json


def idempotency_key(key: str, generation: int) -> str:
    """The ``Idempotency-Key`` of one generation of an operation: ``{key}:g{generation}``.

    Every attempt of a generation sends the same one, so a downstream that honours it turns a
    repeated call into a replay. A new generation (the key reused after its record expired) is a
    new action and sends a new one, so a downstream that still remembers the old key does not
    answer it with the old response.
    """
    return f"{key}:g{generation}"


@dataclass(frozen=True, slots=True)
class OperationRecord:
    """One row of ``agent_operations`` as the database last showed it (times in epoch ms)."""

    id: int
    tenant: str
    key: str
    generation: int
    action_type: str
    params_hash: str
    state: State
    attempts: int
    lease_holder: str | None
    lease_expires_ms: int | None
    result: Any
    external_ref: str | None
    last_error: str | None
    needs_attention: bool
    created_ms: int
    updated_ms: int
    expires_ms: int

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> OperationRecord:
        """Build a record from a row mapping of ``agent_operations``."""
        return cls(
            id=row["id"],
            tenant=row["tenant"],
            key=row["op_key"],
            generation=row["generation"],
            action_type=row["action_type"],
            params_hash=row["params_hash"],
            state=State(row["state"]),
            attempts=row["attempts"],
            lease_holder=row["lease_holder"],
            lease_expires_ms=row["lease_expires_ms"],
            result=None if row["result"] is None else json.loads(row["result"]),
            external_ref=row["external_ref"],
            last_error=row["last_error"],
            needs_attention=bool(row["needs_attention"]),
            created_ms=row["created_ms"],
            updated_ms=row["updated_ms"],
            expires_ms=row["expires_ms"],
        )

    @property
    def idempotency_key(self) -> str:
        """What this generation sends downstream: see :func:`idempotency_key`."""
        return idempotency_key(self.key, self.generation)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (used by the CLI and the audit trail); the row id stays inside."""
        return as_json(self, omit={"id"})


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One row of the append-only ``agent_operation_audit`` trail."""

    generation: int
    attempt: int
    from_state: str | None
    to_state: str
    at_ms: int
    actor: str
    reason: str
    detail: Any

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> AuditEntry:
        """Build an entry from a row mapping of ``agent_operation_audit``."""
        return cls(
            generation=row["generation"],
            attempt=row["attempt"],
            from_state=row["from_state"],
            to_state=row["to_state"],
            at_ms=row["at_ms"],
            actor=row["actor"],
            reason=row["reason"],
            detail=None if row["detail"] is None else json.loads(row["detail"]),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (used by the CLI), with the short names of the trail's columns."""
        return as_json(self, rename={"from_state": "from", "to_state": "to", "actor": "by"})


@dataclass(frozen=True, slots=True)
class Lease:
    """Proof that the holder claimed attempt ``attempt`` of generation ``generation``.

    Finishing calls (complete, fail, mark_unknown) are fenced by it: a worker whose attempt
    was reclaimed, resolved or replaced gets :class:`StaleLeaseError`.
    """

    tenant: str
    key: str
    generation: int
    attempt: int
    holder: str
    claimed_ms: int | None = field(default=None, compare=False)
    """When the claim was made (database clock), for the time-in-state metric."""
    action_type: str | None = field(default=None, compare=False)
    """The operation's action type (fixed for a generation), for the finish's event."""
    params_hash: str | None = field(default=None, compare=False)
    """The operation's parameters hash (fixed for a generation), for the finish's event."""

    @property
    def idempotency_key(self) -> str:
        """What the action sends downstream: see :func:`idempotency_key`."""
        return idempotency_key(self.key, self.generation)


class DecisionKind(StrEnum):
    """What a begin decided."""

    EXECUTE = "execute"
    """Claimed (RUNNING under the returned lease): perform the side effect now."""
    SUCCEEDED = "succeeded"
    """Done before: use ``operation.result``; do not execute."""
    IN_PROGRESS = "in_progress"
    """Another worker holds a live lease: wait or poll, do not execute."""
    UNKNOWN = "unknown"
    """Outcome unknown: no retry until it is reconciled or resolved."""
    FAILED = "failed"
    """Failed for good: ``operation.last_error`` says why; do not execute."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer of :meth:`ActionStore.begin`; ``lease`` is set only for EXECUTE."""

    kind: DecisionKind
    operation: OperationRecord
    lease: Lease | None = None

    @property
    def should_execute(self) -> bool:
        """True only when this caller claimed the operation and must perform it."""
        return self.kind is DecisionKind.EXECUTE


@dataclass(frozen=True, slots=True)
class Found:
    """Reconciler: the action is in the external system; this is its result."""

    result: Any = None
    external_ref: str | None = None


@dataclass(frozen=True, slots=True)
class Absent:
    """Reconciler: the action is proven absent and can no longer land; safe to retry."""

    reason: str = "proven absent in the external system"


@dataclass(frozen=True, slots=True)
class Unclear:
    """Reconciler: cannot tell; the operation stays UNKNOWN and is flagged for a person."""

    reason: str


ReconcileOutcome = Found | Absent | Unclear


class Resolution(StrEnum):
    """An operator's decision for an UNKNOWN (or a PENDING) operation."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRY = "retry"
