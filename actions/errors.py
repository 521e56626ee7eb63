"""Exceptions of the agent-actions module; all are :class:`outbox.OutboxError` subclasses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from outboxkit.outbox.errors import OutboxError

if TYPE_CHECKING:
    from outboxkit.actions.records import OperationRecord


class ActionError(OutboxError):
    """Base class of the agent-action errors."""


class InvalidActionInputError(ActionError, ValueError):
    """A key part, tenant, parameter set or result cannot be used (empty, NaN, not JSON...)."""


class OperationConflictError(ActionError):
    """The key exists with other parameters or another action type: a bug, never a replay.

    The stored result is deliberately not attached.
    """


class OperationNotFoundError(ActionError, LookupError):
    """No operation with this key exists for this tenant."""


class IllegalTransitionError(ActionError):
    """The state machine does not allow this change from the operation's current state."""


class StaleLeaseError(ActionError):
    """The caller's lease no longer owns the operation (it was reclaimed, resolved or replaced)."""


class _OutcomeError(ActionError):
    def __init__(self, message: str, record: OperationRecord) -> None:
        super().__init__(message)
        self.record = record


class ActionFailedError(_OutcomeError):
    """The operation ended FAILED_FINAL; ``record.last_error`` says why."""


class ActionOutcomeUnknownError(_OutcomeError):
    """The operation is UNKNOWN: it will not be retried until it is reconciled or resolved."""


class ActionInProgressError(_OutcomeError):
    """Another worker still holds a live lease on the operation; ask again later."""
