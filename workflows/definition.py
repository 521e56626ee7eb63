"""A workflow defined in code: a named, versioned state machine of async handlers.

::

    orders = Workflow("purchase_order", version=2, initial="intake")

    @orders.state("intake")
    async def intake(ctx: WorkflowContext) -> Next:
        return Goto("validate")

    @orders.compensation("purchasing.cancel_order", authorised_by="procurement")
    async def cancel_order(ctx: CompensationContext) -> Any: ...

Every definition also has the engine's states: the terminal ``complete``, ``rejected``,
``cancelled``, ``expired`` and ``failed``, ``human_review`` (a person decides) and
``compensating`` (compensations run in reverse order). Running instances keep the version they
started on: keep the older definition registered beside the new one until they have finished.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from outboxkit.actions.reconcile import Reconciler
from outboxkit.workflows.directives import Next
from outboxkit.workflows.errors import WorkflowDefinitionError
from outboxkit.workflows.failures import Budget, FailureClass
from outboxkit.workflows.rechecks import Recheck
from outboxkit.workflows.records import BUILT_IN, HUMAN_REVIEW

if TYPE_CHECKING:
    from outboxkit.workflows.context import WorkflowContext

StateHandler = Callable[["WorkflowContext"], Awaitable[Next]]
"""``async def handler(ctx) -> Goto | Wait | Complete``."""

DEFAULT_RESPONSES: Mapping[FailureClass, str] = {
    FailureClass.PERMANENT: "failed",
    FailureClass.AUTHORIZATION: HUMAN_REVIEW,
    FailureClass.POLICY: HUMAN_REVIEW,
}
"""Where a failure of these classes leads unless the definition says otherwise (transient,
conflict and unknown outcome are retried, reconciled, then sent to human_review)."""


@dataclass(frozen=True, slots=True)
class CompensationContext:
    """What a compensation gets: the effect it undoes and its parameters."""

    tenant: str
    workflow_id: str
    effect_key: str
    params: Any
    idempotency_key: str
    """Send it downstream as the compensation's ``Idempotency-Key``."""


Compensation = Callable[[CompensationContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class CompensationSpec:
    """A registered compensation: a new business action that undoes an effect (a refund)."""

    name: str
    function: Compensation
    authorised_by: str
    """Who may authorise it (recorded with it, shown to operators)."""
    reconciler: Reconciler | None = None


@dataclass(frozen=True, slots=True)
class StateSpec:
    """A state of the definition: its handler, its budget, and its re-checks on resume."""

    name: str
    handler: StateHandler
    budget: Budget
    rechecks: tuple[Recheck, ...] = ()


@dataclass
class Workflow:
    """A versioned workflow definition: states with handlers, compensations, failure routes.

    ``on_failure`` sends a failure class to a state of this definition instead of the default
    (:data:`DEFAULT_RESPONSES`), e.g. ``{FailureClass.PERMANENT: "plan"}`` to re-plan.
    ``reconcilers`` look up an effect of an action type by its key after an unknown outcome.
    ``versions`` (model, prompt, policy, schema) are recorded with every transition.
    ``deadline_s`` bounds a whole run: past it, the instance goes to ``expired`` (after
    compensating). ``redact_keys`` names fields of ``data`` and decisions kept out of the
    history (credentials are always kept out).
    """

    name: str
    version: int
    initial: str = "intake"
    budget: Budget = field(default_factory=Budget)
    on_failure: Mapping[FailureClass, str] = field(default_factory=dict)
    reconcilers: dict[str, Reconciler] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    deadline_s: float | None = None
    redact_keys: tuple[str, ...] = ()
    states: dict[str, StateSpec] = field(default_factory=dict, init=False)
    compensations: dict[str, CompensationSpec] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 128:
            raise WorkflowDefinitionError("a workflow name has 1 to 128 characters")
        if self.version < 1:
            raise WorkflowDefinitionError("a workflow version is a positive integer")

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    def state(
        self, name: str, *, budget: Budget | None = None, rechecks: Sequence[Recheck] = ()
    ) -> Callable[[StateHandler], StateHandler]:
        """Register the decorated async function as the handler of state ``name``.

        ``rechecks`` run, in order, when a signal resumes this state's wait, before the
        workflow moves on: the first that answers a state sends the workflow there instead
        (an expired price to ``needs_quote``), and the approval the signal carried is dropped.
        """
        if name in BUILT_IN:
            raise WorkflowDefinitionError(f"{name!r} is one of the engine's states")
        if name in self.states:
            raise WorkflowDefinitionError(f"state {name!r} already has a handler in {self}")

        def register(handler: StateHandler) -> StateHandler:
            self.states[name] = StateSpec(name, handler, budget or self.budget, tuple(rechecks))
            return handler

        return register

    def compensation(
        self, name: str, *, authorised_by: str, reconciler: Reconciler | None = None
    ) -> Callable[[Compensation], Compensation]:
        """Register the decorated async function as the compensation ``name``."""

        def register(function: Compensation) -> Compensation:
            self.compensations[name] = CompensationSpec(name, function, authorised_by, reconciler)
            return function

        return register

    def knows(self, state: str) -> bool:
        """True if ``state`` is one of this definition's states or the engine's."""
        return state in self.states or state in BUILT_IN

    def response_to(self, failure: FailureClass) -> str | None:
        """The state a failure of this class leads to (``None``: retried in place)."""
        return self.on_failure.get(failure) or DEFAULT_RESPONSES.get(failure)

    def check(self) -> None:
        """Raise :class:`WorkflowDefinitionError` if the definition is inconsistent."""
        if self.initial not in self.states:
            raise WorkflowDefinitionError(
                f"{self}: the initial state {self.initial!r} has no handler"
            )
        for failure, target in self.on_failure.items():
            if not self.knows(target):
                raise WorkflowDefinitionError(
                    f"{self}: {failure} leads to unknown state {target!r}"
                )


class Registry:
    """The definitions an engine runs, by name and version; the newest starts new instances."""

    def __init__(self, definitions: list[Workflow]) -> None:
        self._by_key: dict[tuple[str, int], Workflow] = {}
        for definition in definitions:
            definition.check()
            key = (definition.name, definition.version)
            if key in self._by_key:
                raise WorkflowDefinitionError(f"{definition} is registered twice")
            self._by_key[key] = definition
        if not self._by_key:
            raise WorkflowDefinitionError("an engine needs at least one workflow definition")

    def get(self, name: str, version: int) -> Workflow:
        """The definition ``name`` at ``version``."""
        try:
            return self._by_key[(name, version)]
        except KeyError:
            raise WorkflowDefinitionError(
                f"no definition {name} v{version} is registered: keep the versions of running "
                "instances registered until they finish"
            ) from None

    def latest(self, name: str) -> Workflow:
        """The newest version of ``name``."""
        versions = [version for (known, version) in self._by_key if known == name]
        if not versions:
            raise WorkflowDefinitionError(f"no workflow named {name!r} is registered")
        return self._by_key[(name, max(versions))]

    def __iter__(self) -> Iterator[Workflow]:
        return iter(self._by_key.values())
