"""The live context runtime: effects through the agent-action ledger, cancels seen in the DB."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from outboxkit.actions.errors import ActionOutcomeUnknownError
from outboxkit.actions.reconcile import reconcile_one
from outboxkit.actions.runner import run_action
from outboxkit.actions.states import State
from outboxkit.actions.steps import Actions, Step
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.errors import TransientError
from outboxkit.outbox.retry import RetryPolicy
from outboxkit.workflows import store
from outboxkit.workflows.context import EffectCall, EffectResult, WorkflowContext
from outboxkit.workflows.errors import AuthorizationError, PolicyError, WorkflowCancelledError

if TYPE_CHECKING:
    from outboxkit.workflows.engine import WorkflowEngine


REFUSALS: tuple[type[Exception], ...] = (AuthorizationError, PolicyError)
"""What an effect's call raises when it was refused for authority or policy: nothing happened
downstream, so the operation stays PENDING (never UNKNOWN: it is not reconciled and called
again with the same credential), and the handler gets the error itself, answered by its class
(human_review). Once a person has given fresh authority, resuming runs it again."""


class LiveRuntime:
    """Runs a handler's effects for real: each one an agent action, at most once per key.

    Inside an effect, the ledger retries a :class:`~outboxkit.outbox.errors.TransientError`
    a few times within the handler's timeout (capped backoff, full jitter); when those are
    spent the operation stays PENDING and the state is retried later within its budget. Once a
    cancel is asked, a ``cancellable`` effect is not started: the ledger is read instead, and an
    unknown outcome reconciled, so what already happened is known.
    """

    def __init__(
        self, engine: WorkflowEngine, budget_timeout_s: float, budget_attempts: int
    ) -> None:
        self.engine = engine
        self.timeout_s = budget_timeout_s
        self.retry = RetryPolicy(
            max_attempts=budget_attempts,
            backoff=Backoff(base_s=0.2, cap_s=5.0),
            max_elapsed_s=budget_timeout_s,
        )

    async def effect(self, ctx: WorkflowContext, call: EffectCall) -> EffectResult:
        """Run (or replay) one keyed effect through the ledger."""
        if call.cancellable and await self._cancel_requested(ctx):
            return await self._settle_cancelled(ctx, call)
        outcome = await run_action(
            self.engine.sessions,
            self.engine.action_store,
            call.run,
            tenant=ctx.tenant,
            key=call.key,
            action_type=call.action_type,
            params=call.params,
            timeout_s=call.timeout_s or self.timeout_s,
            retry=self.retry,
            reconciler=call.reconciler,
            keep_pending_when_exhausted=True,
            refusals=REFUSALS,
        )
        return EffectResult(call.key, outcome.result, outcome.executed, outcome.external_ref)

    async def step(
        self,
        ctx: WorkflowContext,
        step: Step[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> EffectResult:
        """Run a ``@step`` function with the workflow id as its run id."""
        actions = Actions(
            self.engine.sessions,
            tenant=ctx.tenant,
            run_id=ctx.workflow_id,
            store=self.engine.action_store,
            timeout_s=self.timeout_s,
            retry=self.retry,
        )
        with actions:
            if await self._cancel_requested(ctx):
                raise WorkflowCancelledError(f"{ctx.workflow_id}: cancel asked before {step.step}")
            outcome = await step.outcome(*args, **kwargs)
        result = outcome.operation.result
        return EffectResult(
            outcome.operation.key, result, outcome.executed, outcome.operation.external_ref
        )

    async def observe(
        self, ctx: WorkflowContext, name: str, fetch: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Read the value now."""
        return await fetch()

    async def _cancel_requested(self, ctx: WorkflowContext) -> bool:
        async with self.engine.sessions() as session:
            current = await store.get(session, ctx.tenant, ctx.workflow_id)
        return current is not None and current.cancel_requested_ms is not None

    async def _settle_cancelled(self, ctx: WorkflowContext, call: EffectCall) -> EffectResult:
        """A cancel is asked: return what the effect did, or stop; never start it now."""
        ledger = self.engine.action_store
        async with self.engine.sessions() as session:
            operation = await ledger.get(session, ctx.tenant, call.key)
        if operation is not None and operation.state is State.UNKNOWN and call.reconciler:
            operation = await reconcile_one(
                self.engine.sessions, ledger, call.reconciler, operation
            )
        if operation is None or operation.state in (State.PENDING, State.FAILED_FINAL):
            raise WorkflowCancelledError(f"{ctx.workflow_id}: cancelled before {call.key}")
        if operation.state is State.SUCCEEDED:
            return EffectResult(call.key, operation.result, False, operation.external_ref)
        if operation.state is State.UNKNOWN:
            raise ActionOutcomeUnknownError(
                f"operation {call.key!r} has an unknown outcome and a cancel is asked", operation
            )
        raise TransientError(f"operation {call.key!r} is running elsewhere")
