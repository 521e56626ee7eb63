"""Exceptions of durable workflows: what the engine raises, and what handlers may raise.

A handler (or a step inside it) says what went wrong by the class of what it raises; the
engine answers each of the six failure classes (:mod:`outboxkit.workflows.failures`) in its own
way. Besides the kernel's :class:`~outboxkit.outbox.errors.TransientError`,
:class:`~outboxkit.outbox.errors.PermanentError` and
:class:`~outboxkit.outbox.errors.OutcomeUnknownError`, a handler raises:

- :class:`ConflictError`: the state it read changed underneath (a 409/412, a stale version):
  refresh and decide again;
- :class:`AuthorizationError`: a token expired or was revoked: never retried with it;
- :class:`PolicyError`: a policy or safety rule refused: never retried around it.
"""

from __future__ import annotations

from outboxkit.outbox.errors import OutboxError


class WorkflowError(OutboxError):
    """Base class of the errors the workflow engine raises."""


class WorkflowDefinitionError(WorkflowError, ValueError):
    """A workflow definition is inconsistent (an unknown state, a missing handler...)."""


class WorkflowNotFoundError(WorkflowError, LookupError):
    """No workflow instance has this tenant and id."""


class WorkflowConflictError(WorkflowError):
    """A workflow id is started again with another input, or under another definition."""


class OperatorActionError(WorkflowError):
    """An operator's cancel, resume or escalate does not apply to the workflow's state."""


class ConflictError(Exception):
    """Raised by a handler: what it read changed meanwhile; read again and decide again."""

    outboxkit_safe_message = True  # raised on purpose, its message written to be read


class AuthorizationError(Exception):
    """Raised by a handler: its credential expired or was revoked; get fresh authority."""

    outboxkit_safe_message = True  # raised on purpose, its message written to be read


class PolicyError(Exception):
    """Raised by a handler: a policy or safety rule refuses; reject or ask a person."""

    outboxkit_safe_message = True  # raised on purpose, its message written to be read


class ApprovalStaleError(WorkflowError):
    """The request changed after it was approved: the approval does not cover it."""


class WorkflowCancelledError(WorkflowError):
    """Raised inside a handler at a cancellable step once a cancel was requested."""


class NondeterminismError(WorkflowError):
    """A replayed handler did something its recorded history does not contain."""
