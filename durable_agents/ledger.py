"""One agent run's records in the action ledger: its start, its steps and its outcome.

Every record is an operation of :class:`~outboxkit.actions.ActionStore` under a key made of
the tenant, the run id, the step and its position, so a run started again with the same run id
finds what it did. Records that are not effects (the run's start, a model answer already
received, an approval) are written with :func:`record_once`: claim and complete in one
transaction, which also writes their CloudEvents through the outbox. Effects go through
:func:`~outboxkit.actions.run_action` (at most once, UNKNOWN reconciled by key).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from outboxkit.actions.errors import OperationConflictError
from outboxkit.actions.hashing import params_hash
from outboxkit.actions.keys import check_tenant, operation_key
from outboxkit.actions.reconcile import Reconciler
from outboxkit.actions.records import Absent, DecisionKind, OperationRecord, ReconcileOutcome
from outboxkit.actions.runner import ActionOutcome, run_action
from outboxkit.actions.store import ActionStore
from outboxkit.agents.errors import AgentRunError, DefinitionChangedError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

MODEL_REQUEST = "agent.model_request"
RUN_RECORDS_TTL_S = 30 * 86400.0
"""How long the default store of an :class:`AgentRun` keeps a record after its last change."""
_CALL: contextvars.ContextVar[CallInfo] = contextvars.ContextVar("outboxkit_agents_call")
_RUN: contextvars.ContextVar[AgentRun] = contextvars.ContextVar("outboxkit_agents_run")


@dataclass(frozen=True)
class AgentRun:
    """One durable agent run: where its records go and the clock its approvals expire on.

    ``run_id`` must survive a restart (a ticket's, a thread's or a workflow's id): the run
    started again with it resumes. ``clock`` (seconds since the epoch) is the business clock
    of approval expiry; tests replace it. ``lease_s`` bounds how long a crashed process's
    claim on a call blocks the next one (heartbeats extend it while a call runs).

    The run's records must outlive the run: a record past its store's ``ttl_s`` may be
    deleted by ``actions cleanup`` or replaced, and a tool call whose record is gone would run
    again. The default store keeps them :data:`RUN_RECORDS_TTL_S` (30 days) after their last
    change; an approval may not stay open longer than its store's ``ttl_s``.
    """

    sessions: async_sessionmaker[AsyncSession]
    _: KW_ONLY
    tenant: str
    run_id: str
    store: ActionStore = field(default_factory=lambda: ActionStore(ttl_s=RUN_RECORDS_TTL_S))
    clock: Callable[[], float] = time.time
    timeout_s: float = 60.0
    lease_s: float | None = None
    wait_in_progress_s: float = 60.0

    def __post_init__(self) -> None:
        check_tenant(self.tenant)
        if not isinstance(self.run_id, str) or not self.run_id.strip():
            raise AgentRunError("run_id must be a non-empty string")

    def key(self, step: str, action_type: str, target: str, version: str | int = 1) -> str:
        """The operation key of one record of this run."""
        return operation_key(self.tenant, self.run_id, step, action_type, target, version)

    async def get(self, key: str) -> OperationRecord | None:
        """The record under ``key``, if any."""
        async with self.sessions() as session:
            return await self.store.get(session, self.tenant, key)


@contextlib.contextmanager
def using_run(run: AgentRun) -> Iterator[AgentRun]:
    """Make ``run`` the run of the durable tools called inside (a context variable)."""
    token = _RUN.set(run)
    try:
        yield run
    finally:
        _RUN.reset(token)


def current_run() -> AgentRun:
    """The run of the innermost :func:`using_run` around this call."""
    try:
        return _RUN.get()
    except LookupError:
        raise AgentRunError("a durable tool runs inside its durable runner's run") from None


@dataclass(frozen=True, slots=True)
class CallInfo:
    """The tool call running now; send ``idempotency_key`` downstream."""

    tenant: str
    run_id: str
    tool: str
    key: str
    idempotency_key: str


def current_call() -> CallInfo:
    """The durable tool call whose function is running (call it from inside the tool)."""
    try:
        return _CALL.get()
    except LookupError:
        raise AgentRunError("current_call() is called from inside a durable tool") from None


async def record_once(
    run: AgentRun,
    key: str,
    action_type: str,
    params: Any,
    result: Callable[[], Any],
    *,
    what: str,
    then: Callable[[AsyncSession], Awaitable[None]] | None = None,
) -> OperationRecord:
    """Record a non-effect under ``key`` once; later calls return the stored record.

    ``result()`` is evaluated only the first time, and so is ``then(session)``, in the same
    transaction after the record is written. Other ``params`` under the key raise
    :class:`DefinitionChangedError` (``what`` names the record in its message).
    """
    async with run.sessions() as session, session.begin():
        try:
            decision = await run.store.begin(
                session, tenant=run.tenant, key=key, action_type=action_type, params=params
            )
        except OperationConflictError as error:
            raise DefinitionChangedError(
                f"run {run.run_id!r}: {what} was recorded with other parameters"
            ) from error
        if decision.kind is DecisionKind.EXECUTE:
            assert decision.lease is not None
            recorded = await run.store.complete(session, decision.lease, result=result())
            if then is not None:
                await then(session)
            return recorded
    if decision.kind is DecisionKind.SUCCEEDED:
        return decision.operation
    raise AgentRunError(f"run {run.run_id!r}: {what} is {decision.operation.state}, not recorded")


async def run_effect(
    run: AgentRun,
    key: str,
    action_type: str,
    params: dict[str, Any],
    call: Callable[[], Awaitable[Any]],
    *,
    tool: str,
    reconciler: Reconciler | None,
    refusals: tuple[type[Exception], ...] = (),
    timeout_s: float | None = None,
) -> ActionOutcome:
    """Run ``call`` at most once under ``key`` (a :func:`run_action`); its result is JSON.

    Inside ``call``, :func:`current_call` gives the key to send downstream.
    """

    async def action(idempotency_key: str) -> Any:
        token = _CALL.set(CallInfo(run.tenant, run.run_id, tool, key, idempotency_key))
        try:
            return await call()
        finally:
            _CALL.reset(token)

    return await run_action(
        run.sessions,
        run.store,
        action,
        tenant=run.tenant,
        key=key,
        action_type=action_type,
        params=params,
        timeout_s=timeout_s or run.timeout_s,
        reconciler=reconciler,
        lease_s=run.lease_s,
        wait_in_progress_s=run.wait_in_progress_s,
        refusals=refusals,
    )


async def _model_requests_are_safe(operation: OperationRecord) -> ReconcileOutcome:
    """A model request has no effect of its own: an interrupted one is asked again."""
    return Absent("a model request changes nothing outside; asking again is safe")


async def recorded_model_request(
    run: AgentRun,
    agent: str,
    position: int,
    fingerprint: dict[str, str],
    ask: Callable[[], Awaitable[Any]],
) -> Any:
    """The answer to model request ``position`` of the run: recorded, or ``ask()``-ed once.

    ``fingerprint`` (what the model was sent, hashed) is the operation's parameters: another
    request at the same position raises :class:`DefinitionChangedError`. ``ask`` returns the
    answer as JSON; a request that failed or was interrupted by a crash is asked again (it
    changed nothing outside), an answered one never is.
    """
    key = run.key(f"model:{position}", MODEL_REQUEST, agent)
    try:
        outcome = await run_effect(
            run,
            key,
            MODEL_REQUEST,
            fingerprint,
            ask,
            tool="model",
            reconciler=_model_requests_are_safe,
            refusals=(Exception,),  # a failed request changed nothing: PENDING, raised
        )
    except OperationConflictError as error:
        raise DefinitionChangedError(
            f"run {run.run_id!r}: model request {position} differs from the recorded one "
            "(other instructions, tools, prompt or tool results)"
        ) from error
    return outcome.result


async def record_start(run: AgentRun, agent: str, version: str | int, prompt: Any) -> None:
    """Record the run's start, or check it against the recorded one (the definition check)."""
    params = {"agent": agent, "version": str(version), "prompt": params_hash(prompt)}
    try:
        await record_once(
            run,
            run.key("run", "agent.run.started", agent),
            "agent.run.started",
            params,
            lambda: params,
            what="the run's start",
        )
    except DefinitionChangedError as error:
        raise DefinitionChangedError(
            f"run {run.run_id!r} was started on another version of agent {agent!r} or with "
            f"another prompt; this is version {version}"
        ) from error


async def record_outcome(run: AgentRun, agent: str, output: Any) -> OperationRecord:
    """Record the run's final output (published as its ``succeeded`` event)."""
    return await record_once(
        run,
        run.key("outcome", "agent.run.completed", agent),
        "agent.run.completed",
        {"output": params_hash(output)},
        lambda: {"output": output},
        what="the run's outcome",
    )


def json_hash(value: Any) -> str:
    """The SHA-256 of the canonical JSON of ``value`` (what an approval is bound to)."""
    return params_hash(value)


__all__ = [
    "MODEL_REQUEST",
    "RUN_RECORDS_TTL_S",
    "AgentRun",
    "CallInfo",
    "current_call",
    "current_run",
    "json_hash",
    "record_once",
    "record_outcome",
    "record_start",
    "recorded_model_request",
    "run_effect",
    "using_run",
]
