"""Agent actions: record each side-effecting action as an operation and run it at most once.

A stable key names one logical action; :class:`ActionStore` decides in code, inside the
caller's transaction, whether it may run, and writes every state change as a CloudEvent
through the outbox. :func:`run_action` wraps the whole cycle. See ``docs/agent-actions.md``.
"""

from outbox.actions.errors import (
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
from outbox.actions.hashing import canonical_json, params_hash
from outbox.actions.keys import operation_key
from outbox.actions.reconcile import Reconciler, reconcile_one, reconcile_unknown
from outbox.actions.records import (
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
from outbox.actions.runner import (
    ActionOutcome,
    ActionResult,
    OutcomeUnknownError,
    PermanentError,
    RetryPolicy,
    TransientError,
    run_action,
)
from outbox.actions.states import State
from outbox.actions.store import ActionStore

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
