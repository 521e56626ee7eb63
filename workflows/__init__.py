"""Durable workflows: state machines on the outbox, the inbox and the agent-action ledger.

A :class:`Workflow` is defined in code (states with async handlers, compensations, failure
routes, a version). A :class:`WorkflowEngine` starts instances in the caller's transaction,
takes their signals through a consumer (deduplicated by the inbox), and lets operators cancel,
resume and escalate; :class:`WorkflowWorker` processes advance them. Every transition is an
append-only history record, published as an event in the same transaction. Waiting holds no
process; an unknown outcome is reconciled by key, or shown to a person, never guessed. See
``docs/workflows.md``.
"""

from outboxkit.workflows.context import WorkflowContext, request_hash
from outboxkit.workflows.definition import CompensationContext, Workflow
from outboxkit.workflows.directives import Complete, Goto, Next, Wait
from outboxkit.workflows.engine import WorkflowEngine
from outboxkit.workflows.errors import (
    ApprovalStaleError,
    AuthorizationError,
    ConflictError,
    NondeterminismError,
    OperatorActionError,
    PolicyError,
    WorkflowCancelledError,
    WorkflowConflictError,
    WorkflowDefinitionError,
    WorkflowError,
    WorkflowNotFoundError,
)
from outboxkit.workflows.failures import Budget, FailureClass, classify
from outboxkit.workflows.records import HistoryRecord, SignalRecord, Status, WorkflowRecord
from outboxkit.workflows.replay import ReplayReport, history_from_json, replay
from outboxkit.workflows.signatures import HmacVerifier, SignalVerifier, sign
from outboxkit.workflows.worker import WorkflowWorker

__all__ = [
    "ApprovalStaleError",
    "AuthorizationError",
    "Budget",
    "CompensationContext",
    "Complete",
    "ConflictError",
    "FailureClass",
    "Goto",
    "HistoryRecord",
    "HmacVerifier",
    "Next",
    "NondeterminismError",
    "OperatorActionError",
    "PolicyError",
    "ReplayReport",
    "SignalRecord",
    "SignalVerifier",
    "Status",
    "Wait",
    "Workflow",
    "WorkflowCancelledError",
    "WorkflowConflictError",
    "WorkflowContext",
    "WorkflowDefinitionError",
    "WorkflowEngine",
    "WorkflowError",
    "WorkflowNotFoundError",
    "WorkflowRecord",
    "WorkflowWorker",
    "classify",
    "history_from_json",
    "replay",
    "request_hash",
    "sign",
]
