"""The decisions one step can make, built as plain values: a :class:`Change` or a :class:`Retry`.

Pure functions of the instance and what its handler did; the advancer chooses among them, the
commit writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outboxkit.actions.errors import ActionOutcomeUnknownError
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.retry import RetryPolicy
from outboxkit.outbox.secrecy import describe_error
from outboxkit.workflows.changes import KEEP, Change
from outboxkit.workflows.context import WorkflowContext
from outboxkit.workflows.definition import Workflow
from outboxkit.workflows.errors import WorkflowDefinitionError
from outboxkit.workflows.failures import Budget, FailureClass
from outboxkit.workflows.records import (
    COMPENSATING,
    HUMAN_REVIEW,
    TERMINAL,
    CompensationEntry,
    Status,
    WorkflowRecord,
)

UNWINDING = frozenset({"cancelled", "failed", "expired"})
"""Terminal states reached through compensation when effects were done."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Run the same state again later, without a transition (the budget counts it)."""

    run_at_ms: int
    attempts: int
    first_failure_ms: int
    failure_class: str
    last_error: str
    open_unknown: str | None


Decision = Change | Retry | None
"""What one step decided; ``None``: nothing to do now (the lease is released)."""


def from_context(record: WorkflowRecord, ctx: WorkflowContext) -> dict[str, Any]:
    """What a handler's run adds to any decision: steps, observations, data, compensations."""
    compensations: list[CompensationEntry] | Any = KEEP
    if ctx.compensations:
        compensations = [*record.compensations, *ctx.compensations]
    return {
        "steps": ctx.steps,
        "observations": ctx.observations,
        "data": ctx.data,
        "versions": ctx.versions or None,
        "compensations": compensations,
        "attempt": ctx.attempt,
    }


def unwind(
    record: WorkflowRecord,
    target: str,
    kind: str,
    trigger: dict[str, Any],
    compensations: list[CompensationEntry],
    now: int,
    **extra: Any,
) -> Change:
    """Go to ``target``; a terminal unwinding state goes through compensating first if needed."""
    if target in UNWINDING and compensations:
        return Change(
            kind=kind,
            to_state=COMPENSATING,
            status=Status.RUNNABLE,
            trigger=trigger,
            actor="worker",
            run_at_ms=now,
            compensations=compensations,
            after_compensation=target,
            **extra,
        )
    status = Status.WAITING if target == HUMAN_REVIEW else Status.RUNNABLE
    return Change(
        kind=kind,
        to_state=target,
        status=status,
        trigger=trigger,
        actor="worker",
        run_at_ms=None if status is Status.WAITING else now,
        compensations=compensations,
        review_from=record.state if target == HUMAN_REVIEW else KEEP,
        **extra,
    )


def review(
    record: WorkflowRecord,
    kind: str,
    failure: FailureClass,
    error: BaseException,
    now: int,
    ctx: WorkflowContext | None = None,
    *,
    unknown: str | None = None,
) -> Change:
    """To human_review, with the failure, the error and any unknown operation in plain view."""
    common = from_context(record, ctx) if ctx is not None else {}
    if common.get("compensations") is KEEP:
        del common["compensations"]
    return Change(
        kind=kind,
        to_state=HUMAN_REVIEW,
        status=Status.WAITING,
        trigger={**trigger_of(record), "failure": failure.value},
        actor="worker",
        decision={"failure": failure.value, "error": describe_error(error, with_class=True)},
        unknown=unknown,
        review_from=record.state,
        failure_class=failure.value,
        last_error=describe_error(error, with_class=True),
        open_unknown=unknown,
        **common,
    )


def retry_later(
    record: WorkflowRecord, budget: Budget, failure: FailureClass, error: BaseException, now: int
) -> Retry | None:
    """Run again after a backoff (at once for a conflict), or ``None`` if the budget is spent."""
    attempts = record.attempts + 1
    first = record.first_failure_ms or now
    if attempts >= budget.max_attempts or now - first >= budget.total_s * 1000:
        return None
    delay = 0.0 if failure is FailureClass.CONFLICT else budget.backoff.delay(attempts)
    return Retry(
        now + int(delay * 1000),
        attempts,
        first,
        failure.value,
        describe_error(error, with_class=True),
        record.open_unknown,
    )


def adopt_cancel(current: WorkflowRecord, decision: Change, now: int) -> Change:
    """A cancel asked while the state ran: unwind instead of going where the handler said."""
    if decision.to_state in TERMINAL or decision.to_state in (COMPENSATING, HUMAN_REVIEW):
        return decision
    compensations = (
        current.compensations if decision.compensations is KEEP else decision.compensations
    )
    trigger = {"kind": "cancel", "reason": current.cancel_reason, "during": decision.kind}
    return unwind(
        current,
        "cancelled",
        "cancel",
        trigger,
        compensations,
        now,
        steps=decision.steps,
        observations=decision.observations,
        data=decision.data,
    )


def check_target(definition: Workflow, state: str) -> None:
    """Raise :class:`WorkflowDefinitionError` unless ``state`` is one of the definition's."""
    if not definition.knows(state):
        raise WorkflowDefinitionError(f"{definition} has no state {state!r}")


def trigger_of(record: WorkflowRecord) -> dict[str, Any]:
    """The trigger of a handler's run: its state and attempt."""
    return {"kind": "step", "state": record.state, "attempt": record.attempts + 1}


def unknown_key(error: BaseException) -> str | None:
    """The key of the operation an error left with an unknown outcome, if it names one."""
    return error.record.key if isinstance(error, ActionOutcomeUnknownError) else None


def effect_retry(budget: Budget) -> RetryPolicy:
    """The ledger's retries of one effect within one run of a state."""
    return RetryPolicy(
        max_attempts=budget.max_attempts,
        backoff=Backoff(base_s=0.2, cap_s=5.0),
        max_elapsed_s=budget.step_timeout_s,
    )
