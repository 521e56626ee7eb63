"""The step API: an agent's side-effecting tool as one decorated async function.

::

    @step("payments.refund", target="charge_id", reconciler=lookup_refund)
    async def refund(charge_id: str, amount_cents: int) -> Refund:
        reply = await provider.refund(charge_id, amount_cents, key=current_step().idempotency_key)
        return Refund.model_validate(reply)

    with Actions(sessions, tenant="acme", run_id=run_id):
        refund_made = await refund("ch_42", 1999)  # a Refund, also when replayed

The call's arguments, bound to the signature and validated against its annotations, are the
parameters: the function receives exactly what was hashed. The operation key is
``operation_key(tenant, run_id, step, action_type, target, version)``; the result is validated
into the return annotation from the stored JSON, the same way on the first execution and on a
replay. The tenant and run id come from the :class:`Actions` the call runs under (a context
variable, so it passes through an agent framework's run into its tools). Underneath, every
call is a :func:`~outboxkit.actions.runner.run_action`.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from types import TracebackType
from typing import Any, Generic, ParamSpec, TypeVar

from outboxkit.actions.errors import ActionError, InvalidActionInputError
from outboxkit.actions.hashing import canonical_json, params_hash
from outboxkit.actions.keys import check_tenant, operation_key
from outboxkit.actions.reconcile import Reconciler
from outboxkit.actions.records import OperationRecord
from outboxkit.actions.runner import ActionResult, run_action
from outboxkit.actions.store import ActionStore
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.retry import RetryPolicy
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_TIMEOUT_S = 60.0

_RUN: contextvars.ContextVar[Actions] = contextvars.ContextVar("outboxkit_actions_run")
_STEP: contextvars.ContextVar[StepInfo] = contextvars.ContextVar("outboxkit_actions_step")


class StepContextError(ActionError, RuntimeError):
    """A step was called outside ``with Actions(...)``, or ``current_step()`` outside a step."""


@dataclass(frozen=True)
class Actions:
    """One agent run's access to the action ledger, and the defaults of its steps.

    ``with actions:`` makes it the context of every step called inside (in this task and the
    tasks it starts), so an agent framework's tools find it. Building one does no I/O; make
    one per run (or :meth:`for_run`). ``timeout_s`` bounds one call of a step's function;
    ``lease_s`` (default the store's, 30 s) is extended every ``heartbeat_s`` (default a third
    of it) while it runs. The rest is passed to
    :func:`~outboxkit.actions.runner.run_action`.
    """

    sessions: async_sessionmaker[AsyncSession]
    _: KW_ONLY
    tenant: str
    run_id: str
    store: ActionStore = field(default_factory=ActionStore)
    timeout_s: float = DEFAULT_TIMEOUT_S
    lease_s: float | None = None
    heartbeat_s: float | None = None
    retry: RetryPolicy | None = None
    wait_in_progress_s: float = 30.0
    poll_backoff: Backoff | None = None
    _tokens: list[contextvars.Token[Actions]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        check_tenant(self.tenant)
        if not isinstance(self.run_id, str) or not self.run_id.strip():
            raise InvalidActionInputError("run_id must be a non-empty string")

    def for_run(self, run_id: str, *, tenant: str | None = None) -> Actions:
        """The same ledger and defaults for another run (and tenant)."""
        return dataclasses.replace(self, run_id=run_id, tenant=tenant or self.tenant)

    def __enter__(self) -> Actions:
        self._tokens.append(_RUN.set(self))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        _RUN.reset(self._tokens.pop())


def current_actions() -> Actions:
    """The :class:`Actions` of the innermost ``with actions:`` around this call."""
    try:
        return _RUN.get()
    except LookupError:
        raise StepContextError(
            "a step runs inside `with Actions(sessions, tenant=..., run_id=...):`"
        ) from None


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What a running step's function may need: above all the key to send downstream."""

    tenant: str
    run_id: str
    step: str
    action_type: str
    key: str
    idempotency_key: str
    """``{key}:g{generation}``: send it as the downstream request's ``Idempotency-Key``."""


def current_step() -> StepInfo:
    """The step whose function is running (call it from inside the decorated function)."""
    try:
        return _STEP.get()
    except LookupError:
        raise StepContextError("current_step() is called from inside a step's function") from None


@dataclass(frozen=True, slots=True)
class StepOutcome(Generic[R]):
    """A step's typed result, with its operation; ``executed`` is False for a replay."""

    value: R
    operation: OperationRecord
    executed: bool


class Step(Generic[P, R]):
    """An at-most-once action made from an async function; call it like the function.

    Raises what :func:`~outboxkit.actions.runner.run_action` raises:
    :class:`~outboxkit.actions.errors.OperationConflictError` (the key exists with other
    parameters), :class:`~outboxkit.actions.errors.ActionOutcomeUnknownError` (UNKNOWN: not
    retried until reconciled), :class:`~outboxkit.actions.errors.ActionFailedError` (failed for
    good), :class:`~outboxkit.actions.errors.ActionInProgressError` (another worker still runs
    it after the wait). Arguments that do not fit the annotations raise
    :class:`~outboxkit.actions.errors.InvalidActionInputError` before anything runs.
    """

    def __init__(
        self,
        function: Callable[P, Awaitable[R]],
        *,
        action_type: str,
        step: str | None,
        target: Sequence[str],
        version: str | int,
        reconciler: Reconciler | None,
        external_ref: Callable[[Any], str | None] | None,
        timeout_s: float | None,
        retry: RetryPolicy | None,
    ) -> None:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"@step goes on an async function, not {function!r}")
        functools.update_wrapper(self, function)
        self._function = function
        self._signature = inspect.signature(function)
        unknown = [name for name in target if name not in self._signature.parameters]
        if unknown:
            raise TypeError(f"target {unknown} is not a parameter of {function.__qualname__}")
        self.action_type = action_type
        self.step = step or action_type
        self.target = tuple(target)
        self.version = version
        self.reconciler = reconciler
        self.external_ref = external_ref
        self.timeout_s = timeout_s
        self.retry = retry
        operation_key("t", "r", self.step, action_type, "x", version)  # check the parts now

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the step (or return its stored result) and return the typed result."""
        return (await self.outcome(*args, **kwargs)).value

    async def outcome(self, *args: P.args, **kwargs: P.kwargs) -> StepOutcome[R]:
        """Like calling the step, with the operation and whether this call executed it."""
        actions = current_actions()
        bound, params = self._bind(args, kwargs)
        key = self._key(actions, params)
        result_type = self._types().result

        async def action(idempotency_key: str) -> ActionResult:
            info = StepInfo(
                actions.tenant, actions.run_id, self.step, self.action_type, key, idempotency_key
            )
            token = _STEP.set(info)
            try:
                value = await self._function(*bound.args, **bound.kwargs)
            finally:
                _STEP.reset(token)
            value = result_type.validate_python(value)  # a wrong type raises: UNKNOWN
            return ActionResult(
                value=result_type.dump_python(value, mode="json"),
                external_ref=self.external_ref(value) if self.external_ref else None,
            )

        outcome = await run_action(
            actions.sessions,
            actions.store,
            action,
            tenant=actions.tenant,
            key=key,
            action_type=self.action_type,
            params=params,
            timeout_s=self.timeout_s or actions.timeout_s,
            retry=self.retry or actions.retry,
            reconciler=self.reconciler,
            lease_s=actions.lease_s,
            heartbeat_s=actions.heartbeat_s,
            wait_in_progress_s=actions.wait_in_progress_s,
            poll_backoff=actions.poll_backoff,
        )
        value = result_type.validate_python(outcome.result)
        return StepOutcome(value, outcome.operation, outcome.executed)

    def key(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """The operation key these arguments have in the current run (no database access)."""
        return self._key(current_actions(), self._bind(args, kwargs)[1])

    def _key(self, actions: Actions, params: dict[str, Any]) -> str:
        if self.target:
            target_id = canonical_json([params[name] for name in self.target])
        else:
            target_id = params_hash(params)
        return operation_key(
            actions.tenant, actions.run_id, self.step, self.action_type, target_id, self.version
        )

    def _bind(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[inspect.BoundArguments, dict[str, Any]]:
        """Bind and validate the arguments; return them and their JSON form (the params)."""
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        adapters = self._types().params
        params: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            adapter = adapters[name]
            try:
                bound.arguments[name] = checked = adapter.validate_python(value)
                params[name] = adapter.dump_python(checked, mode="json")
            except (ValidationError, ValueError, TypeError) as error:
                raise InvalidActionInputError(
                    f"argument {name!r} of step {self.step!r} does not fit its annotation: {error}"
                ) from error
        return bound, params

    def _types(self) -> _Types:
        # Resolved at the first call, so annotations may name classes defined after the step.
        resolved = self.__dict__.get("_resolved")
        if resolved is None:
            try:
                hints = typing.get_type_hints(self._function, include_extras=True)
            except Exception as error:
                raise TypeError(
                    f"cannot resolve the annotations of {self._function.__qualname__}: {error}"
                ) from error
            resolved = self.__dict__["_resolved"] = _Types.of(self._signature, hints)
        return typing.cast(_Types, resolved)


@dataclass(frozen=True, slots=True)
class _Types:
    """The validators of a step's parameters and result, from its annotations."""

    params: dict[str, TypeAdapter[Any]]
    result: TypeAdapter[Any]

    @classmethod
    def of(cls, signature: inspect.Signature, hints: dict[str, Any]) -> _Types:
        params: dict[str, TypeAdapter[Any]] = {}
        for name, parameter in signature.parameters.items():
            hint = hints.get(name, Any)
            if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
                hint = tuple[hint, ...]  # type: ignore[valid-type]
            elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
                hint = dict[str, hint]  # type: ignore[valid-type]
            params[name] = TypeAdapter(hint)
        return cls(params, TypeAdapter(hints.get("return", Any)))


def step(
    action_type: str,
    *,
    step: str | None = None,
    target: str | Sequence[str] = (),
    version: str | int = 1,
    reconciler: Reconciler | None = None,
    external_ref: Callable[[Any], str | None] | None = None,
    timeout_s: float | None = None,
    retry: RetryPolicy | None = None,
) -> Callable[[Callable[P, Awaitable[R]]], Step[P, R]]:
    """Make an async function an at-most-once step of type ``action_type``; see :class:`Step`.

    The operation key is ``operation_key(tenant, run_id, step, action_type, target_id,
    version)``: ``step`` defaults to ``action_type``; ``target_id`` is the canonical JSON of the
    arguments named by ``target`` (e.g. ``target="charge_id"``), or, without ``target``, the
    hash of all arguments. So, within one run: the same call again is a replay (the stored
    result); without ``target`` other arguments are another operation; with ``target`` other
    arguments for the same target are refused (:class:`OperationConflictError`). Give ``step``
    when one run takes the same action at two different steps on purpose.

    ``reconciler`` resolves an UNKNOWN operation found at begin (a restarted run);
    ``external_ref(result)`` gives the external system's reference to record; ``timeout_s`` and
    ``retry`` override the :class:`Actions` defaults.
    """
    targets = (target,) if isinstance(target, str) else tuple(target)

    def decorate(function: Callable[P, Awaitable[R]]) -> Step[P, R]:
        return Step(
            function,
            action_type=action_type,
            step=step,
            target=targets,
            version=version,
            reconciler=reconciler,
            external_ref=external_ref,
            timeout_s=timeout_s,
            retry=retry,
        )

    return decorate
