"""Exceptions the agent-action ledger raises; all are :class:`~outboxkit.outbox.OutboxError`
subclasses.

What an *action* raises to say how its failure should be read (``TransientError``,
``PermanentError``, ``OutcomeUnknownError``) lives in :mod:`outboxkit.outbox.errors`, shared with
consumers' handlers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outboxkit.outbox.errors import OutboxError, OutcomeUnknownError

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


class LeaseExpiredError(StaleLeaseError):
    """The lease still names this attempt but expired before its outcome was recorded.

    Raised only when a finishing call requires a live lease (the runner does): the worker then
    records UNKNOWN, since others may already have been told the outcome is unknown.
    """


class _OutcomeError(ActionError):
    def __init__(self, message: str, record: OperationRecord) -> None:
        super().__init__(message)
        self.record = record


class ActionFailedError(_OutcomeError):
    """The operation ended FAILED_FINAL; ``record.last_error`` says why."""


class ActionOutcomeUnknownError(_OutcomeError, OutcomeUnknownError):
    """The operation is UNKNOWN: it will not be retried until it is reconciled or resolved.

    Kept apart from :class:`~outboxkit.outbox.errors.OutcomeUnknownError`, which it subclasses,
    because the two say different things. ``OutcomeUnknownError`` is an action's own report
    about one call ("my call may have landed"); it is one of several ways in (a timeout, an
    unclassified exception, an expired lease are the others). This error is the ledger's
    answer about the operation: it is UNKNOWN now, whichever way it got there and even when
    this caller made no call at all (it found it UNKNOWN at begin), and it carries the
    operation's ``record``. Subclassing keeps one vocabulary for callers:
    ``except OutcomeUnknownError`` catches both.
    """


class ActionInProgressError(_OutcomeError):
    """Another worker still holds a live lease on the operation; ask again later."""
