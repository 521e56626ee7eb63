"""The six failure classes, how an exception is classified, and the budgets that bound retries.

Default responses (a definition may send a class to a state of its own, see
:class:`~outboxkit.workflows.definition.Workflow`):

==================  =============================================================================
class               default response
==================  =============================================================================
transient           stay, retry after capped backoff with full jitter, within the budget; then
                    human_review
permanent           compensate what was done, then ``failed`` (or a state, e.g. re-plan)
conflict            run the state again at once on fresh reads, within the budget
authorization       human_review (fresh authority from a person); never retried with that token
unknown outcome     reconcile the step by its key before anything else; still unclear:
                    human_review, the unknown operation named
policy / safety     human_review (or ``rejected``); never retried
==================  =============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from outboxkit.actions.errors import ActionFailedError, ActionInProgressError
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.errors import OutcomeUnknownError, PermanentError, TransientError
from outboxkit.workflows.errors import (
    ApprovalStaleError,
    AuthorizationError,
    ConflictError,
    PolicyError,
)


class FailureClass(StrEnum):
    """What kind of failure a handler met, which decides the engine's response."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    CONFLICT = "conflict"
    AUTHORIZATION = "authorization"
    UNKNOWN_OUTCOME = "unknown_outcome"
    POLICY = "policy"


def classify(error: BaseException) -> FailureClass:
    """The failure class of an exception raised by a handler or a step inside it.

    An exception of no known class counts as transient: orchestration code has no effects of
    its own (every effect is a keyed step), so running it again is safe, and the budget stops a
    bug from looping; the budget's end is human_review, not a guess.
    """
    if isinstance(error, OutcomeUnknownError):
        return FailureClass.UNKNOWN_OUTCOME
    if isinstance(error, PolicyError):
        return FailureClass.POLICY
    if isinstance(error, AuthorizationError):
        return FailureClass.AUTHORIZATION
    if isinstance(error, ConflictError | ApprovalStaleError):
        return FailureClass.CONFLICT
    if isinstance(error, PermanentError | ActionFailedError):
        return FailureClass.PERMANENT
    if isinstance(error, TransientError | ActionInProgressError | TimeoutError):
        return FailureClass.TRANSIENT
    return FailureClass.TRANSIENT


@dataclass(frozen=True, slots=True)
class Budget:
    """How much a state may cost before a person looks: attempts, total time, time per call.

    ``max_attempts`` counts the failed runs of one visit of a state (transient and conflict
    failures); ``total_s`` bounds the time from the first of those failures to the next retry;
    ``step_timeout_s`` bounds one run of a state's handler (its steps included); ``backoff``
    spaces transient retries (full jitter).
    """

    max_attempts: int = 5
    total_s: float = 3600.0
    step_timeout_s: float = 60.0
    backoff: Backoff = field(default_factory=lambda: Backoff(base_s=1.0, cap_s=300.0))

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.total_s <= 0 or self.step_timeout_s <= 0:
            raise ValueError("total_s and step_timeout_s must be positive")
