"""One step of one claimed instance: run its state, resume it, expire it, compensate, cancel.

A step reads the instance it claimed, works outside any transaction (handlers call keyed
effects, each its own short transaction in the ledger), then writes its decision in one
transaction that re-reads the row under its lock: if the lease was lost or an operator acted
meanwhile, the decision is dropped (the effects were keyed, so whoever runs the state next gets
their stored results); if a cancel was asked meanwhile, the cancel wins.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import secrets
from typing import TYPE_CHECKING, Any

from cloudevents.core.v1.event import CloudEvent
from outboxkit.outbox.secrecy import describe_error
from outboxkit.workflows import matching, store
from outboxkit.workflows.changes import KEEP, Change
from outboxkit.workflows.commit import commit
from outboxkit.workflows.compensation import compensate
from outboxkit.workflows.context import WorkflowContext, request_hash
from outboxkit.workflows.decisions import (
    Decision,
    Retry,
    check_target,
    from_context,
    retry_later,
    review,
    trigger_of,
    unknown_key,
    unwind,
)
from outboxkit.workflows.definition import StateSpec, Workflow
from outboxkit.workflows.directives import Complete, Goto, Next, Wait
from outboxkit.workflows.errors import (
    ApprovalStaleError,
    WorkflowCancelledError,
    WorkflowDefinitionError,
)
from outboxkit.workflows.events import deadline_timer, reminder_timer
from outboxkit.workflows.failures import FailureClass, classify
from outboxkit.workflows.metrics import FAILURES
from outboxkit.workflows.records import (
    COMPENSATING,
    HUMAN_REVIEW,
    TERMINAL,
    Approval,
    SignalRecord,
    Status,
    WaitSpec,
    WorkflowRecord,
)
from outboxkit.workflows.runtime import LiveRuntime

if TYPE_CHECKING:
    from outboxkit.workflows.engine import WorkflowEngine


class Advancer:
    """Claims due instances and advances each one step (the engine's worker side)."""

    def __init__(self, engine: WorkflowEngine) -> None:
        self.engine = engine

    async def run_due(self, holder: str, limit: int) -> int:
        """Claim up to ``limit`` due instances and advance them side by side."""
        engine = self.engine
        async with engine.sessions() as session, session.begin():
            claimed = await store.claim_due(
                session,
                holder=holder,
                now_ms=engine.now_ms(),
                lease_ms=int(engine.lease_s * 1000),
                limit=limit,
            )
        results = await asyncio.gather(
            *(self.advance(record, holder) for record in claimed), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result  # the others finished; an outage is the worker's to retry
        return len(claimed)

    async def advance(self, record: WorkflowRecord, holder: str) -> None:
        """Advance one claimed instance by one step and write the decision."""
        definition = self.engine.registry.get(record.name, record.version)
        now = self.engine.now_ms()
        decision = await self._decide(record, definition, now)
        await commit(self.engine, record, holder, decision, now)

    async def _decide(self, record: WorkflowRecord, definition: Workflow, now: int) -> Decision:
        if record.terminal:
            return None
        if record.state == COMPENSATING:
            return await compensate(self.engine, record, definition, now)
        if record.cancel_requested_ms is not None:
            return await self._cancel(record, definition, now)
        if record.state == HUMAN_REVIEW:
            return None
        if record.wait is not None:
            return await self._waiting(record, definition, record.wait, now)
        if record.deadline_ms is not None and now >= record.deadline_ms:
            trigger = {"kind": "timer", "deadline_ms": record.deadline_ms}
            return unwind(record, "expired", "deadline", trigger, record.compensations, now)
        return await self._run_state(record, definition, now)

    async def _run_state(
        self, record: WorkflowRecord, definition: Workflow, now: int, *, state: str | None = None
    ) -> Decision:
        name = state or record.state
        spec = definition.states.get(name)
        if spec is None:
            error = WorkflowDefinitionError(f"{definition} has no handler for state {name!r}")
            return review(record, "failure", FailureClass.PERMANENT, error, now)
        if state is not None and state != record.state:
            record = dataclasses.replace(record, state=state)
        budget = spec.budget
        runtime = LiveRuntime(self.engine, budget.step_timeout_s, budget.max_attempts)
        ctx = WorkflowContext(record=record, definition=definition, runtime=runtime, now_ms=now)
        cancelling = record.cancel_requested_ms is not None
        try:
            step = await asyncio.wait_for(spec.handler(ctx), budget.step_timeout_s)
        except WorkflowCancelledError:
            return self._cancelled(record, ctx, now)
        except Exception as error:  # every failure is classified; none is guessed away
            return self._failure(record, definition, spec, ctx, error, now)
        if cancelling:
            return self._cancelled(record, ctx, now)
        try:
            return self._next(record, definition, ctx, step, now)
        except WorkflowDefinitionError as error:
            return review(record, "failure", FailureClass.PERMANENT, error, now, ctx)

    def _next(
        self,
        record: WorkflowRecord,
        definition: Workflow,
        ctx: WorkflowContext,
        step: Next,
        now: int,
    ) -> Change:
        common = from_context(record, ctx)
        if isinstance(step, Goto):
            check_target(definition, step.state)
            return Change(
                kind="transition",
                to_state=step.state,
                status=Status.RUNNABLE,
                trigger=trigger_of(record),
                actor=ctx.actor,
                decision=step.decision,
                run_at_ms=now,
                **common,
            )
        if isinstance(step, Complete):
            return Change(
                kind="complete",
                to_state="complete",
                status=Status.DONE,
                trigger=trigger_of(record),
                actor=ctx.actor,
                decision=step.decision,
                result=step.result,
                **common,
            )
        if isinstance(step, Wait):
            return self._wait(record, definition, ctx, step, now, common)
        raise WorkflowDefinitionError(
            f"the handler of {record.state!r} returned {type(step).__name__}, "
            "not Goto, Wait or Complete"
        )

    def _wait(
        self,
        record: WorkflowRecord,
        definition: Workflow,
        ctx: WorkflowContext,
        wait: Wait,
        now: int,
        common: dict[str, Any],
    ) -> Change:
        for target in [*wait.on.values(), wait.on_deadline]:
            check_target(definition, target)
        spec = WaitSpec(
            on=dict(wait.on),
            sources=list(wait.sources),
            correlation=ctx.correlation,
            deadline_ms=now + int(wait.deadline_s * 1000),
            on_deadline=wait.on_deadline,
            remind_every_ms=None
            if wait.remind_every_s is None
            else int(wait.remind_every_s * 1000),
            request_hash=None if wait.approval_for is None else request_hash(wait.approval_for),
            started_ms=now,
            timer_secret=secrets.token_hex(32),
        )
        sink = self.engine.sink
        timers = (
            deadline_timer(
                sink.source, sink.signals_topic, record.tenant, record.workflow_id, spec
            ),
            reminder_timer(
                sink.source, sink.signals_topic, record.tenant, record.workflow_id, spec, 1
            ),
        )
        events: list[tuple[CloudEvent, str, dt.datetime | None]] = [
            timer for timer in timers if timer is not None
        ]
        # The wait as decided (what it awaits and where each answer leads) is part of the
        # record: a replay of the history compares it with what the code decides now.
        decision: dict[str, Any] = {
            "on": spec.on,
            "on_deadline": spec.on_deadline,
            "decision": wait.decision,
        }
        if spec.request_hash is not None:
            decision["awaiting_approval_of"] = spec.request_hash
        return Change(
            kind="wait",
            to_state=record.state,
            status=Status.WAITING,
            trigger=trigger_of(record),
            actor=ctx.actor,
            decision=decision,
            wait=spec,
            events=events,
            **common,
        )

    async def _waiting(
        self, record: WorkflowRecord, definition: Workflow, wait: WaitSpec, now: int
    ) -> Decision:
        async with self.engine.sessions() as session:
            accepted = await store.signals(
                session, record.tenant, record.workflow_id, [matching.ACCEPTED]
            )
        signal = next((s for s in accepted if s.correlation == wait.correlation), None)
        if signal is not None:
            return await self._resume(record, definition, wait, signal, now)
        if now >= wait.deadline_ms:
            trigger = {"kind": "timer", "deadline_ms": wait.deadline_ms}
            return unwind(record, wait.on_deadline, "deadline", trigger, record.compensations, now)
        return None

    async def _resume(
        self,
        record: WorkflowRecord,
        definition: Workflow,
        wait: WaitSpec,
        signal: SignalRecord,
        now: int,
    ) -> Decision:
        spec = definition.states.get(record.state)
        budget = spec.budget if spec is not None else definition.budget
        runtime = LiveRuntime(self.engine, budget.step_timeout_s, budget.max_attempts)
        ctx = WorkflowContext(
            record=record, definition=definition, runtime=runtime, now_ms=now, signal=signal
        )
        ctx.data["last_signal"] = {
            "type": signal.type,
            "source": signal.source,
            "id": signal.event_id,
            "principal": signal.principal,
            "data": signal.data,
        }
        target = wait.on[signal.type]
        failed_check = None
        try:
            for check in spec.rechecks if spec is not None else ():
                other = await asyncio.wait_for(check(ctx), budget.step_timeout_s)
                if other is not None:
                    check_target(definition, other)
                    failed_check = {"recheck": getattr(check, "__name__", str(check)), "to": other}
                    target = other
                    break
        except Exception as error:
            if spec is None:
                raise
            return self._failure(record, definition, spec, ctx, error, now)
        approval: Approval | None = KEEP
        approval_ref = None
        if wait.request_hash is not None:
            approval_ref = signal.ref
            approval = None
            if failed_check is None:
                approval = Approval(
                    record.state, wait.request_hash, signal.type, signal.principal, signal.ref
                )
        return Change(
            kind="resume",
            to_state=target,
            status=Status.RUNNABLE,
            trigger={
                "kind": "signal",
                "type": signal.type,
                "source": signal.source,
                "id": signal.event_id,
                "principal": signal.principal,
            },
            actor=signal.principal or signal.source,
            decision=failed_check,
            run_at_ms=now,
            approval=approval,
            approval_ref=approval_ref,
            **from_context(record, ctx),
        )

    async def _cancel(self, record: WorkflowRecord, definition: Workflow, now: int) -> Decision:
        if record.open_unknown is None and (
            record.wait is not None or record.state == HUMAN_REVIEW
        ):
            return self._cancelled(record, None, now)
        state = record.review_from if record.state == HUMAN_REVIEW else record.state
        if state is None or state not in definition.states:
            return self._cancelled(record, None, now)
        # Run the state again with effects that may not start: done ones replay (and register
        # their compensations), an unknown one is reconciled, nothing new happens.
        return await self._run_state(record, definition, now, state=state)

    def _cancelled(self, record: WorkflowRecord, ctx: WorkflowContext | None, now: int) -> Change:
        compensations = list(record.compensations)
        extra: dict[str, Any] = {}
        if ctx is not None:
            extra = from_context(record, ctx)
            if extra["compensations"] is not KEEP:
                compensations = extra["compensations"]
            del extra["compensations"]
        trigger = {"kind": "cancel", "reason": record.cancel_reason}
        return unwind(record, "cancelled", "cancel", trigger, compensations, now, **extra)

    def _failure(
        self,
        record: WorkflowRecord,
        definition: Workflow,
        spec: StateSpec,
        ctx: WorkflowContext,
        error: Exception,
        now: int,
    ) -> Decision:
        failure = classify(error)
        FAILURES.labels(record.name, failure.value).inc()
        if isinstance(error, ApprovalStaleError) and record.approval is not None:
            return Change(
                kind="approval_stale",
                to_state=record.approval.state,
                status=Status.RUNNABLE,
                trigger=trigger_of(record),
                actor=ctx.actor,
                decision={"reason": describe_error(error, with_class=True)},
                run_at_ms=now,
                approval=None,
                **from_context(record, ctx),
            )
        if isinstance(error, ApprovalStaleError):
            failure = FailureClass.POLICY  # no approval at all: fail closed
        if failure is FailureClass.UNKNOWN_OUTCOME:
            key = unknown_key(error)
            if key is not None and record.open_unknown != key:
                # Reconcile by key before anything else: the state runs again and the ledger
                # asks the reconciler about this operation first.
                delay = spec.budget.backoff.delay(1)
                return Retry(
                    now + int(delay * 1000),
                    record.attempts + 1,
                    record.first_failure_ms or now,
                    failure.value,
                    describe_error(error, with_class=True),
                    key,
                )
            return review(record, "unknown", failure, error, now, ctx, unknown=key)
        if failure in (FailureClass.TRANSIENT, FailureClass.CONFLICT):
            retry = retry_later(record, spec.budget, failure, error, now)
            return (
                retry if retry is not None else review(record, "failure", failure, error, now, ctx)
            )
        target = definition.response_to(failure) or HUMAN_REVIEW
        if target == HUMAN_REVIEW:
            return review(record, "failure", failure, error, now, ctx)
        common = from_context(record, ctx)
        compensations = common.pop("compensations")
        if compensations is KEEP:
            compensations = record.compensations
        if target in TERMINAL:
            trigger = {**trigger_of(record), "failure": failure.value}
            return unwind(
                record,
                target,
                "failure",
                trigger,
                compensations,
                now,
                failure_class=failure.value,
                last_error=describe_error(error, with_class=True),
                **common,
            )
        return Change(
            kind="failure",
            to_state=target,
            status=Status.RUNNABLE,
            trigger={**trigger_of(record), "failure": failure.value},
            actor=ctx.actor,
            decision={"failure": failure.value, "error": describe_error(error, with_class=True)},
            run_at_ms=now,
            compensations=compensations,
            **common,
        )
