"""Agent actions: record each side-effecting action as an operation and run it at most once.

``@step("payments.refund")`` on an async function makes it an at-most-once step with typed
arguments and result, run under ``with Actions(sessions, tenant=..., run_id=...):``. Below it, a
stable key names one logical action; :class:`ActionStore` decides in code, inside the caller's
transaction, whether it may run, and writes every state change as a CloudEvent through the
outbox. :func:`run_action` wraps the whole cycle. See ``docs/agent-actions.md``.

What an action raises (``TransientError``, ``PermanentError``, ``OutcomeUnknownError``) and
the ``RetryPolicy`` come from :mod:`outboxkit.outbox`, shared with consumers. Internals
(hashing, tables, events, metrics, cleanup) stay importable from their own modules.
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
from outboxkit.actions.events import (
    ActionEventData,
    ActionFailed,
    ActionFlagged,
    ActionReconciled,
    ActionRequested,
    ActionStarted,
    ActionSucceeded,
    ActionUnknown,
)
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
from outboxkit.actions.runner import ActionOutcome, ActionResult, run_action
from outboxkit.actions.states import State
from outboxkit.actions.steps import (
    Actions,
    Step,
    StepContextError,
    StepInfo,
    StepOutcome,
    current_step,
    step,
)
from outboxkit.actions.store import ActionStore

__all__ = [
    "Absent",
    "ActionError",
    "ActionEventData",
    "ActionFailed",
    "ActionFailedError",
    "ActionFlagged",
    "ActionInProgressError",
    "ActionOutcome",
    "ActionOutcomeUnknownError",
    "ActionReconciled",
    "ActionRequested",
    "ActionResult",
    "ActionStarted",
    "ActionStore",
    "ActionSucceeded",
    "ActionUnknown",
    "Actions",
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
    "ReconcileOutcome",
    "Reconciler",
    "Resolution",
    "StaleLeaseError",
    "State",
    "Step",
    "StepContextError",
    "StepInfo",
    "StepOutcome",
    "Unclear",
    "current_step",
    "operation_key",
    "reconcile_one",
    "reconcile_unknown",
    "run_action",
    "step",
]
