"""Running an instance's registered compensations, last first, each as a keyed step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outboxkit.actions.runner import run_action
from outboxkit.workflows.changes import Change
from outboxkit.workflows.decisions import (
    Decision,
    effect_retry,
    retry_later,
    review,
    unknown_key,
)
from outboxkit.workflows.definition import CompensationContext, Workflow
from outboxkit.workflows.errors import WorkflowDefinitionError
from outboxkit.workflows.failures import FailureClass, classify
from outboxkit.workflows.records import COMPENSATING, Status, WorkflowRecord

if TYPE_CHECKING:
    from outboxkit.workflows.engine import WorkflowEngine


async def compensate(
    engine: WorkflowEngine, record: WorkflowRecord, definition: Workflow, now: int
) -> Decision:
    """Run the last registered compensation; with none left, go to the final state.

    A compensation is an agent action keyed ``{effect_key}:undo``; one that fails for good, or
    whose outcome stays unknown, sends the instance to human_review (``compensation_failed``).
    """
    final = record.after_compensation or "failed"
    trigger = {"kind": "compensation"}
    if not record.compensations:
        return Change(
            kind="compensated",
            to_state=final,
            status=Status.DONE,
            trigger=trigger,
            actor="worker",
            compensations=[],
        )
    entry = record.compensations[-1]
    spec = definition.compensations.get(entry.name)
    budget = definition.budget
    if spec is None:
        error = WorkflowDefinitionError(f"{definition} has no compensation {entry.name!r}")
        return review(record, "compensation_failed", FailureClass.PERMANENT, error, now)

    async def undo(idempotency_key: str) -> Any:
        context = CompensationContext(
            record.tenant, record.workflow_id, entry.effect_key, entry.params, idempotency_key
        )
        return await spec.function(context)

    try:
        outcome = await run_action(
            engine.sessions,
            engine.action_store,
            undo,
            tenant=record.tenant,
            key=entry.key,
            action_type=entry.name,
            params={"effect_key": entry.effect_key, "params": entry.params},
            timeout_s=budget.step_timeout_s,
            retry=effect_retry(budget),
            reconciler=spec.reconciler,
            keep_pending_when_exhausted=True,
        )
    except Exception as error:
        failure = classify(error)
        if failure in (FailureClass.TRANSIENT, FailureClass.CONFLICT):
            retry = retry_later(record, budget, failure, error, now)
            if retry is not None:
                return retry
        return review(
            record, "compensation_failed", failure, error, now, unknown=unknown_key(error)
        )
    rest = record.compensations[:-1]
    return Change(
        kind="compensate",
        to_state=COMPENSATING if rest else final,
        status=Status.RUNNABLE,
        trigger=trigger,
        actor="worker",
        decision={
            "compensated": entry.effect_key,
            "with": entry.name,
            "authorised_by": entry.authorised_by,
        },
        steps=[
            {
                "action_type": entry.name,
                "key": entry.key,
                "result": outcome.result,
                "executed": outcome.executed,
                "external_ref": outcome.external_ref,
            }
        ],
        run_at_ms=now,
        compensations=rest,
    )
