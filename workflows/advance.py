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
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cloudevents.core.v1.event import CloudEvent
from outboxkit.actions.errors import ActionOutcomeUnknownError
from outboxkit.actions.runner import run_action
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.retry import RetryPolicy
from outboxkit.workflows import matching, store
from outboxkit.workflows.changes import KEEP, Change, write
from outboxkit.workflows.context import WorkflowContext, request_hash
from outboxkit.workflows.definition import CompensationContext, StateSpec, Workflow
from outboxkit.workflows.directives import Complete, Goto, Next, Wait
from outboxkit.workflows.errors import (
    ApprovalStaleError,
    WorkflowCancelledError,
    WorkflowDefinitionError,
)
from outboxkit.workflows.events import timer_event
from outboxkit.workflows.failures import Budget, FailureClass, classify
from outboxkit.workflows.metrics import FAILURES, TRANSITIONS
from outboxkit.workflows.records import (
    COMPENSATING,
    HUMAN_REVIEW,
    TERMINAL,
    Approval,
    CompensationEntry,
    SignalRecord,
    Status,
    WaitSpec,
    WorkflowRecord,
)
from outboxkit.workflows.runtime import LiveRuntime

if TYPE_CHECKING:
    from outboxkit.workflows.engine import WorkflowEngine

log = logging.getLogger("outboxkit.workflows")
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
        await self._commit(record, holder, decision, now)

    async def _decide(self, record: WorkflowRecord, definition: Workflow, now: int) -> Decision:
        if record.terminal:
            return None
        if record.state == COMPENSATING:
            return await self._compensate(record, definition, now)
        if record.cancel_requested_ms is not None:
            return await self._cancel(record, definition, now)
        if record.state == HUMAN_REVIEW:
            return None
        if record.wait is not None:
            return await self._waiting(record, definition, record.wait, now)
        if record.deadline_ms is not None and now >= record.deadline_ms:
            trigger = {"kind": "timer", "deadline_ms": record.deadline_ms}
            return _unwind(record, "expired", "deadline", trigger, record.compensations, now)
        return await self._run_state(record, definition, now)

    async def _run_state(
        self, record: WorkflowRecord, definition: Workflow, now: int, *, state: str | None = None
    ) -> Decision:
        name = state or record.state
        spec = definition.states.get(name)
        if spec is None:
            error = WorkflowDefinitionError(f"{definition} has no handler for state {name!r}")
            return _review(record, "failure", FailureClass.PERMANENT, error, now)
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
            return _review(record, "failure", FailureClass.PERMANENT, error, now, ctx)

    def _next(
        self,
        record: WorkflowRecord,
        definition: Workflow,
        ctx: WorkflowContext,
        step: Next,
        now: int,
    ) -> Change:
        common = _from_context(record, ctx)
        if isinstance(step, Goto):
            _check_target(definition, step.state)
            return Change(
                kind="transition",
                to_state=step.state,
                status=Status.RUNNABLE,
                trigger=_trigger(record),
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
                trigger=_trigger(record),
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
            _check_target(definition, target)
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
        )
        sink = self.engine.sink
        events: list[tuple[CloudEvent, str, dt.datetime | None]] = [
            (
                timer_event(
                    sink.source, record.tenant, record.workflow_id, spec.correlation, "deadline"
                ),
                sink.signals_topic,
                _instant(spec.deadline_ms),
            )
        ]
        if spec.remind_every_ms is not None and now + spec.remind_every_ms < spec.deadline_ms:
            reminder = timer_event(
                sink.source, record.tenant, record.workflow_id, spec.correlation, "reminder", 1
            )
            events.append((reminder, sink.signals_topic, _instant(now + spec.remind_every_ms)))
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
            trigger=_trigger(record),
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
            return _unwind(record, wait.on_deadline, "deadline", trigger, record.compensations, now)
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
                    _check_target(definition, other)
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
            **_from_context(record, ctx),
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
            extra = _from_context(record, ctx)
            if extra["compensations"] is not KEEP:
                compensations = extra["compensations"]
            del extra["compensations"]
        trigger = {"kind": "cancel", "reason": record.cancel_reason}
        return _unwind(record, "cancelled", "cancel", trigger, compensations, now, **extra)

    async def _compensate(self, record: WorkflowRecord, definition: Workflow, now: int) -> Decision:
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
            return _review(record, "compensation_failed", FailureClass.PERMANENT, error, now)

        async def undo(idempotency_key: str) -> Any:
            context = CompensationContext(
                record.tenant, record.workflow_id, entry.effect_key, entry.params, idempotency_key
            )
            return await spec.function(context)

        try:
            outcome = await run_action(
                self.engine.sessions,
                self.engine.action_store,
                undo,
                tenant=record.tenant,
                key=entry.key,
                action_type=entry.name,
                params={"effect_key": entry.effect_key, "params": entry.params},
                timeout_s=budget.step_timeout_s,
                retry=_effect_retry(budget),
                reconciler=spec.reconciler,
                keep_pending_when_exhausted=True,
            )
        except Exception as error:
            failure = classify(error)
            if failure in (FailureClass.TRANSIENT, FailureClass.CONFLICT):
                retry = _retry(record, budget, failure, error, now)
                if retry is not None:
                    return retry
            return _review(
                record, "compensation_failed", failure, error, now, unknown=_unknown_key(error)
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
                trigger=_trigger(record),
                actor=ctx.actor,
                decision={"reason": _describe(error)},
                run_at_ms=now,
                approval=None,
                **_from_context(record, ctx),
            )
        if isinstance(error, ApprovalStaleError):
            failure = FailureClass.POLICY  # no approval at all: fail closed
        if failure is FailureClass.UNKNOWN_OUTCOME:
            key = _unknown_key(error)
            if key is not None and record.open_unknown != key:
                # Reconcile by key before anything else: the state runs again and the ledger
                # asks the reconciler about this operation first.
                delay = spec.budget.backoff.delay(1)
                return Retry(
                    now + int(delay * 1000),
                    record.attempts + 1,
                    record.first_failure_ms or now,
                    failure.value,
                    _describe(error),
                    key,
                )
            return _review(record, "unknown", failure, error, now, ctx, unknown=key)
        if failure in (FailureClass.TRANSIENT, FailureClass.CONFLICT):
            retry = _retry(record, spec.budget, failure, error, now)
            return (
                retry if retry is not None else _review(record, "failure", failure, error, now, ctx)
            )
        target = definition.response_to(failure) or HUMAN_REVIEW
        if target == HUMAN_REVIEW:
            return _review(record, "failure", failure, error, now, ctx)
        common = _from_context(record, ctx)
        compensations = common.pop("compensations")
        if compensations is KEEP:
            compensations = record.compensations
        if target in TERMINAL:
            trigger = {**_trigger(record), "failure": failure.value}
            return _unwind(
                record,
                target,
                "failure",
                trigger,
                compensations,
                now,
                failure_class=failure.value,
                last_error=_describe(error),
                **common,
            )
        return Change(
            kind="failure",
            to_state=target,
            status=Status.RUNNABLE,
            trigger={**_trigger(record), "failure": failure.value},
            actor=ctx.actor,
            decision={"failure": failure.value, "error": _describe(error)},
            run_at_ms=now,
            compensations=compensations,
            **common,
        )

    async def _commit(
        self, claimed: WorkflowRecord, holder: str, decision: Decision, now: int
    ) -> None:
        engine = self.engine
        async with engine.sessions() as session, session.begin():
            current = await store.get(session, claimed.tenant, claimed.workflow_id, lock=True)
            if current is None or current.lease_holder != holder or current.seq != claimed.seq:
                log.info(
                    "workflow %s: lease lost or changed meanwhile; its step is dropped",
                    claimed.workflow_id,
                )
                return
            if decision is None:
                await store.release(session, current.id, holder)
                return
            if isinstance(decision, Retry):
                await store.update_instance(
                    session,
                    current.id,
                    {
                        "status": Status.RUNNABLE.value,
                        "run_at_ms": decision.run_at_ms,
                        "attempts": decision.attempts,
                        "first_failure_ms": decision.first_failure_ms,
                        "failure_class": decision.failure_class,
                        "last_error": decision.last_error,
                        "open_unknown": decision.open_unknown,
                        "lease_holder": None,
                        "lease_expires_ms": None,
                        "updated_ms": now,
                    },
                )
                return
            if current.cancel_requested_ms is not None and claimed.cancel_requested_ms is None:
                decision = _adopt_cancel(current, decision, now)
            written = await write(session, engine.sink, current, decision, now)
            TRANSITIONS.labels(current.name, decision.kind).inc()
            if decision.kind == "resume":
                await self._settle_signals(session, claimed, written)
            if decision.wait is not None:
                await self._match_pending(session, written, now)

    async def _settle_signals(
        self, session: Any, claimed: WorkflowRecord, written: WorkflowRecord
    ) -> None:
        """The signal that resumed the wait is consumed; others accepted for it came late."""
        wait = claimed.wait
        assert wait is not None
        first = True
        for signal in await store.signals(
            session, claimed.tenant, claimed.workflow_id, [matching.ACCEPTED]
        ):
            if signal.correlation != wait.correlation:
                continue
            if first:
                await store.set_signal_outcome(
                    session,
                    signal.source,
                    signal.event_id,
                    matching.CONSUMED,
                    consumed_seq=written.seq,
                )
                first = False
            else:
                await store.set_signal_outcome(
                    session,
                    signal.source,
                    signal.event_id,
                    matching.LATE,
                    reason="another signal resumed the wait first",
                )

    async def _match_pending(self, session: Any, written: WorkflowRecord, now: int) -> None:
        """Signals that arrived before the wait began are judged against it now."""
        wait = written.wait
        assert wait is not None
        accepted = False
        for signal in await store.signals(
            session, written.tenant, written.workflow_id, [matching.PENDING]
        ):
            outcome, reason = matching.judge(wait, signal)
            if outcome == matching.PENDING:
                continue
            await store.set_signal_outcome(
                session, signal.source, signal.event_id, outcome, reason=reason
            )
            accepted = accepted or outcome == matching.ACCEPTED
        if accepted:
            await store.update_instance(
                session, written.id, {"status": Status.RUNNABLE.value, "run_at_ms": now}
            )
            await store.notify(session, written.workflow_id)


def _from_context(record: WorkflowRecord, ctx: WorkflowContext) -> dict[str, Any]:
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


def _unwind(
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


def _review(
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
    common = _from_context(record, ctx) if ctx is not None else {}
    if common.get("compensations") is KEEP:
        del common["compensations"]
    return Change(
        kind=kind,
        to_state=HUMAN_REVIEW,
        status=Status.WAITING,
        trigger={**_trigger(record), "failure": failure.value},
        actor="worker",
        decision={"failure": failure.value, "error": _describe(error)},
        unknown=unknown,
        review_from=record.state,
        failure_class=failure.value,
        last_error=_describe(error),
        open_unknown=unknown,
        **common,
    )


def _retry(
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
        _describe(error),
        record.open_unknown,
    )


def _adopt_cancel(current: WorkflowRecord, decision: Change, now: int) -> Change:
    """A cancel asked while the state ran: unwind instead of going where the handler said."""
    if decision.to_state in TERMINAL or decision.to_state in (COMPENSATING, HUMAN_REVIEW):
        return decision
    compensations = (
        current.compensations if decision.compensations is KEEP else decision.compensations
    )
    trigger = {"kind": "cancel", "reason": current.cancel_reason, "during": decision.kind}
    return _unwind(
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


def _check_target(definition: Workflow, state: str) -> None:
    if not definition.knows(state):
        raise WorkflowDefinitionError(f"{definition} has no state {state!r}")


def _trigger(record: WorkflowRecord) -> dict[str, Any]:
    return {"kind": "step", "state": record.state, "attempt": record.attempts + 1}


def _unknown_key(error: BaseException) -> str | None:
    return error.record.key if isinstance(error, ActionOutcomeUnknownError) else None


def _effect_retry(budget: Budget) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=budget.max_attempts,
        backoff=Backoff(base_s=0.2, cap_s=5.0),
        max_elapsed_s=budget.step_timeout_s,
    )


def _describe(error: BaseException) -> str:
    text = str(error).strip()
    first = text.splitlines()[0][:300] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _instant(epoch_ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC)
