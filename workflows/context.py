"""What a state's handler works with: the instance's data, and keyed steps recorded in history.

Orchestration is deterministic: everything that has an effect or that may answer differently
next time (a model call, a price lookup, a clock reading beyond ``ctx.now``) goes through
``ctx.effect``, ``ctx.step`` or ``ctx.observe``, so its result is recorded with the transition.
A handler that runs again (its worker died, it failed transiently) gets stored results for the
effects it already made: each is an agent action, at most once per key. A replay of the history
(:mod:`outboxkit.workflows.replay`) gets them from the history instead.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from outboxkit.actions.hashing import params_hash
from outboxkit.actions.reconcile import Reconciler
from outboxkit.actions.steps import Step
from outboxkit.workflows.errors import ApprovalStaleError, WorkflowDefinitionError
from outboxkit.workflows.records import Approval, CompensationEntry, SignalRecord, WorkflowRecord

if TYPE_CHECKING:
    from outboxkit.workflows.definition import Workflow

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class EffectCall:
    """One keyed effect a handler asks for (see :meth:`WorkflowContext.effect`)."""

    action_type: str
    key: str
    params: Any
    run: Callable[[str], Awaitable[Any]]
    reconciler: Reconciler | None
    cancellable: bool
    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class EffectResult:
    """What an effect gave: its key, its stored JSON result, whether this run executed it."""

    key: str
    result: Any
    executed: bool
    external_ref: str | None


class ContextRuntime(Protocol):
    """Runs a context's effects and observations: live (the engine) or from history (replay)."""

    async def effect(self, ctx: WorkflowContext, call: EffectCall) -> EffectResult:
        """Run (or replay) one keyed effect."""
        ...

    async def step(
        self,
        ctx: WorkflowContext,
        step: Step[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> EffectResult:
        """Run (or replay) a ``@step`` function under this workflow's run."""
        ...

    async def observe(
        self, ctx: WorkflowContext, name: str, fetch: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Read (or replay) a value that may differ next time."""
        ...


def request_hash(request: Any) -> str:
    """The SHA-256 of a request's canonical JSON: what an approval is bound to."""
    return params_hash(request)


class WorkflowContext:
    """One run of one state's handler for one workflow instance.

    ``data`` is the instance's own variables (JSON values): change it in place, and the change
    is stored with the transition (and snapshotted into its history record, redacted: keep
    needless personal data out of it). ``input`` is what the workflow was started with.
    ``signal`` is the event that resumed this state, if one did; ``now`` is the moment the run
    began on the engine's clock (the same when the history is replayed).
    """

    def __init__(
        self,
        *,
        record: WorkflowRecord,
        definition: Workflow,
        runtime: ContextRuntime,
        now_ms: int,
        signal: SignalRecord | None = None,
        actor: str = "worker",
    ) -> None:
        self.record = record
        self.definition = definition
        self.data: dict[str, Any] = copy.deepcopy(record.data)
        self.signal = signal
        self.now_ms = now_ms
        self.actor = actor
        self.versions: dict[str, str] = dict(definition.versions)
        self.steps: list[dict[str, Any]] = []
        self.observations: list[dict[str, Any]] = []
        self.compensations: list[CompensationEntry] = []
        self._runtime = runtime

    @property
    def tenant(self) -> str:
        """The instance's tenant."""
        return self.record.tenant

    @property
    def workflow_id(self) -> str:
        """The instance's id (unique per tenant)."""
        return self.record.workflow_id

    @property
    def state(self) -> str:
        """The state whose handler is running."""
        return self.record.state

    @property
    def input(self) -> Any:
        """What the workflow was started with."""
        return self.data.get("input")

    @property
    def attempt(self) -> int:
        """1 for the first run of this visit of the state, 2 after one failure, ..."""
        return self.record.attempts + 1

    @property
    def now(self) -> dt.datetime:
        """When this run began, on the engine's clock (timezone-aware UTC)."""
        return dt.datetime.fromtimestamp(self.now_ms / 1000, dt.UTC)

    @property
    def correlation(self) -> str:
        """The token a reply to this visit of the state must carry (``correlationid``)."""
        return f"{self.workflow_id}:{self.state}:{self.record.entered_seq}"

    @property
    def approval(self) -> Approval | None:
        """The approval the workflow holds, if any."""
        return self.record.approval

    def record_versions(self, **versions: str) -> None:
        """Record the model, prompt, policy or schema versions this decision used."""
        self.versions.update({name: str(value) for name, value in versions.items()})

    def require_approval(self, request: Any) -> Approval:
        """The approval covering ``request`` as it is now, or :class:`ApprovalStaleError`.

        Call it right before the effect the approval authorises: a request that changed after
        it was approved (another amount, supplier, record version) is a new decision, and the
        engine takes the workflow back to the state where it was approved.
        """
        approval = self.record.approval
        if approval is None:
            raise ApprovalStaleError("no approval is held for this request")
        if approval.request_hash != request_hash(request):
            raise ApprovalStaleError(
                f"the request changed after it was approved in {approval.state!r} "
                f"(approved {approval.request_hash[:12]}, now {request_hash(request)[:12]})"
            )
        return approval

    async def effect(
        self,
        action_type: str,
        *,
        key: str,
        params: Any,
        run: Callable[[str], Awaitable[T]],
        reconciler: Reconciler | None = None,
        cancellable: bool = True,
        timeout_s: float | None = None,
    ) -> Any:
        """Run ``run(idempotency_key)`` at most once for ``key``; return its stored JSON result.

        ``key`` names the business action (``PO-2026-481:issue:v1``): the same key with other
        ``params`` is refused. ``run`` gets the key to send downstream as its
        ``Idempotency-Key``. An unknown outcome is reconciled by key with ``reconciler`` (the
        definition's reconciler for ``action_type`` if not given) before anything else.
        ``cancellable``: once a cancel is requested, the effect is not started (what it may
        already have done is still settled). ``timeout_s`` bounds one call (default: the
        state's budget).
        """
        call = EffectCall(
            action_type,
            key,
            params,
            run,
            reconciler or self.definition.reconcilers.get(action_type),
            cancellable,
            timeout_s,
        )
        outcome = await self._runtime.effect(self, call)
        self._note_step(action_type, outcome)
        return outcome.result

    async def step(self, step: Step[Any, T], *args: Any, **kwargs: Any) -> Any:
        """Call an ``@step`` function as part of this workflow (its run id is the workflow id).

        Returns the stored JSON result, validated back into the step's return type.
        """
        outcome = await self._runtime.step(self, step, args, kwargs)
        self._note_step(step.action_type, outcome)
        return outcome.result

    def compensate_with(self, name: str, params: Any, *, effect_key: str) -> None:
        """Register the compensation of the effect ``effect_key``: ``name`` with ``params``.

        Registered compensations run in reverse order after a failure or a cancel, each as a
        keyed step of its own (``{effect_key}:undo``). Register right after the effect
        returned; a handler that runs again registers it again, and it is kept once.
        """
        spec = self.definition.compensations.get(name)
        if spec is None:
            raise WorkflowDefinitionError(f"no compensation named {name!r} in {self.definition}")
        entry = CompensationEntry(name, effect_key, params, spec.authorised_by)
        known = [*self.record.compensations, *self.compensations]
        if all(existing.effect_key != effect_key for existing in known):
            self.compensations.append(entry)

    async def observe(self, name: str, fetch: Callable[[], Awaitable[T]]) -> T:
        """Read something that may answer differently next time; recorded in the history.

        For model calls, price or budget lookups, permission checks. The value must be JSON.
        """
        value: T = await self._runtime.observe(self, name, fetch)
        self.observations.append({"name": name, "value": value})
        return value

    def _note_step(self, action_type: str, outcome: EffectResult) -> None:
        self.steps.append(
            {
                "action_type": action_type,
                "key": outcome.key,
                "result": outcome.result,
                "executed": outcome.executed,
                "external_ref": outcome.external_ref,
            }
        )
