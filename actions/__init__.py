"""Agent actions: record each side-effecting action as an operation and run it at most once.

A stable key names one logical action; :class:`ActionStore` decides in code, inside the
caller's transaction, whether it may run, and writes every state change as a CloudEvent
through the outbox. :func:`run_action` wraps the whole cycle. See ``docs/agent-actions.md``.
"""

from outboxkit.actions.errors import (
    ActionError,
    ActionFailedError,
    ActionInProgressError,
    ActionOutcomeUnknownError,
    IllegalTransitionError,
    InvalidActionInputError,
    OperationConflictError,
    OperationNotFoundError,
    StaleLeaseError,
)
from outboxkit.actions.hashing import canonical_json, params_hash
from outboxkit.actions.keys import operation_key
from outboxkit.actions.reconcile import Reconciler, reconcile_one, reconcile_unknown
from outboxkit.actions.records import (
    Absent,
    AuditEntry,
    Decision,
    DecisionKind,
    Found,
    Lease,
    OperationRecord,
    ReconcileOutcome,
    Resolution,
    Unclear,
)
from outboxkit.actions.runner import (
    ActionOutcome,
    ActionResult,
    OutcomeUnknownError,
    PermanentError,
    RetryPolicy,
    TransientError,
    run_action,
)
from outboxkit.actions.states import State
from outboxkit.actions.store import ActionStore

__all__ = [
    "Absent",
    "ActionError",
    "ActionFailedError",
    "ActionInProgressError",
    "ActionOutcome",
    "ActionOutcomeUnknownError",
    "ActionResult",
    "ActionStore",
    "AuditEntry",
    "Decision",
    "DecisionKind",
    "Found",
    "IllegalTransitionError",
    "InvalidActionInputError",
    "Lease",
    "OperationConflictError",
    "OperationNotFoundError",
    "OperationRecord",
    "OutcomeUnknownError",
    "PermanentError",
    "ReconcileOutcome",
    "Reconciler",
    "Resolution",
    "RetryPolicy",
    "StaleLeaseError",
    "State",
    "TransientError",
    "Unclear",
    "canonical_json",
    "operation_key",
    "params_hash",
    "reconcile_one",
    "reconcile_unknown",
    "run_action",
]
