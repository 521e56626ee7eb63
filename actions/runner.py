"""Running one agent action end to end: begin, execute once, record, retry only when safe.

The action is ``async def action(idempotency_key: str) -> value | ActionResult``; pass the key
on to the downstream as its ``Idempotency-Key``. How its exceptions are read:

- :class:`TransientError`: it certainly did not take effect (refused, 429/503 before
  processing...). Retried with capped exponential backoff and full jitter while attempts last;
  the last one ends FAILED_FINAL.
- :class:`PermanentError`: it certainly did not take effect and never will: FAILED_FINAL.
- a timeout, :class:`OutcomeUnknownError` or any other exception: it may have taken effect.
  UNKNOWN, never retried until it is reconciled or resolved by a person.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from outboxkit.actions.errors import (
    ActionFailedError,
    ActionInProgressError,
    ActionOutcomeUnknownError,
)
from outboxkit.actions.reconcile import Reconciler, reconcile_one
from outboxkit.actions.records import DecisionKind, Lease, OperationRecord
from outboxkit.actions.store import ActionStore, new_holder
from outboxkit.outbox.backoff import Backoff
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

LEASE_MARGIN_MS = 5_000


class TransientError(Exception):
    """Raised by an action whose call certainly did not take effect but may succeed later."""


class PermanentError(Exception):
    """Raised by an action whose call certainly did not take effect and never will."""


class OutcomeUnknownError(Exception):
    """Raised by an action that cannot tell whether its call took effect (e.g. lost reply)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently :func:`run_action` retries.

    ``max_attempts`` counts the operation's attempts (kept in the database, so it holds across
    restarts). ``wait_in_progress_s`` is how long to poll an operation another worker is
    running before giving up with :class:`ActionInProgressError`.
    """

    max_attempts: int = 3
    backoff: Backoff = field(default_factory=lambda: Backoff(base_s=0.2, cap_s=5.0))
    poll: Backoff = field(default_factory=lambda: Backoff(base_s=0.05, cap_s=1.0, floor_s=0.02))
    wait_in_progress_s: float = 30.0


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What an action may return to give the external system's reference with its result."""

    value: Any = None
    external_ref: str | None = None


@dataclass(frozen=True, slots=True)
class ActionOutcome:
    """A successful operation; ``executed`` is False when a stored result was returned."""

    operation: OperationRecord
    executed: bool

    @property
    def result(self) -> Any:
        """The stored JSON result."""
        return self.operation.result

    @property
    def external_ref(self) -> str | None:
        """The external system's reference, if the action gave one."""
        return self.operation.external_ref


Action = Callable[[str], Awaitable[Any]]


async def run_action(
    sessions: async_sessionmaker[AsyncSession],
    store: ActionStore,
    action: Action,
    *,
    tenant: str,
    key: str,
    action_type: str,
    params: Any,
    timeout: float,
    retry: RetryPolicy | None = None,
    reconciler: Reconciler | None = None,
    lease_ms: int | None = None,
) -> ActionOutcome:
    """Run ``action(key)`` at most once for ``(tenant, key)`` and return the recorded outcome.

    Each step is its own short transaction from ``sessions``. The lease defaults to
    ``timeout`` plus 5 s, so a sweep does not take a call that is still within its timeout
    for lost. An UNKNOWN operation found at begin is reconciled once with ``reconciler`` if
    one is given (a restarted agent resumes this way); otherwise, and if it stays UNKNOWN,
    :class:`ActionOutcomeUnknownError` is raised. Also raises :class:`ActionFailedError`,
    :class:`ActionInProgressError` and :class:`OperationConflictError`.
    """
    retry = retry or RetryPolicy()
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    lease_ms = lease_ms if lease_ms is not None else int(timeout * 1000) + LEASE_MARGIN_MS
    holder = new_holder()
    reconciled = False
    polls = 0
    wait_deadline: float | None = None
    while True:
        async with sessions() as session, session.begin():
            decision = await store.begin(
                session,
                tenant=tenant,
                key=key,
                action_type=action_type,
                params=params,
                lease_ms=lease_ms,
                holder=holder,
            )
        op = decision.operation
        if decision.kind is DecisionKind.SUCCEEDED:
            return ActionOutcome(op, executed=False)
        if decision.kind is DecisionKind.FAILED:
            raise ActionFailedError(f"operation {key!r} failed: {op.last_error}", op)
        if decision.kind is DecisionKind.UNKNOWN:
            if reconciler is not None and not reconciled:
                reconciled = True
                await reconcile_one(sessions, store, reconciler, op, actor=f"reconciler:{holder}")
                continue
            raise ActionOutcomeUnknownError(_unknown_message(op), op)
        if decision.kind is DecisionKind.IN_PROGRESS:
            now = time.monotonic()
            wait_deadline = wait_deadline or now + retry.wait_in_progress_s
            if now >= wait_deadline:
                raise ActionInProgressError(
                    f"operation {key!r} is still running under {op.lease_holder}", op
                )
            polls += 1
            await asyncio.sleep(min(retry.poll.delay(polls), max(0.0, wait_deadline - now)))
            continue
        assert decision.lease is not None
        outcome = await _execute(sessions, store, action, decision.lease, timeout, retry)
        if outcome is not None:
            return outcome
        polls = 0
        wait_deadline = None


async def _execute(
    sessions: async_sessionmaker[AsyncSession],
    store: ActionStore,
    action: Action,
    lease: Lease,
    timeout: float,
    retry: RetryPolicy,
) -> ActionOutcome | None:
    """Run one claimed attempt; ``None`` means a transient failure to retry after a pause."""
    try:
        value = await asyncio.wait_for(action(lease.key), timeout)
    except TimeoutError as error:
        reason = f"no answer within {timeout:g}s; the action may have taken effect"
        op = await _settle(sessions, lambda s: store.mark_unknown(s, lease, reason))
        raise ActionOutcomeUnknownError(_unknown_message(op), op) from error
    except TransientError as error:
        final = lease.attempt >= retry.max_attempts
        message = _describe(error)
        if final:
            message = f"gave up after {lease.attempt} attempts; last: {message}"
        op = await _settle(sessions, lambda s: store.fail(s, lease, message, final=final))
        if final:
            raise ActionFailedError(f"operation {lease.key!r} failed: {message}", op) from error
        await asyncio.sleep(retry.backoff.delay(lease.attempt))
        return None
    except PermanentError as error:
        message = _describe(error)
        op = await _settle(sessions, lambda s: store.fail(s, lease, message, final=True))
        raise ActionFailedError(f"operation {lease.key!r} failed: {op.last_error}", op) from error
    except Exception as error:  # OutcomeUnknownError or anything unclassified: never guess
        message = _describe(error)
        op = await _settle(sessions, lambda s: store.mark_unknown(s, lease, message))
        raise ActionOutcomeUnknownError(_unknown_message(op), op) from error
    except BaseException as error:  # cancelled mid-call: the call may have landed
        message = f"cancelled: {_describe(error)}"
        await asyncio.shield(_settle(sessions, lambda s: store.mark_unknown(s, lease, message)))
        raise
    if isinstance(value, ActionResult):
        result, external_ref = value.value, value.external_ref
    else:
        result, external_ref = value, None
    op = await _settle(
        sessions, lambda s: store.complete(s, lease, result=result, external_ref=external_ref)
    )
    return ActionOutcome(op, executed=True)


async def _settle(
    sessions: async_sessionmaker[AsyncSession],
    change: Callable[[AsyncSession], Awaitable[OperationRecord]],
) -> OperationRecord:
    async with sessions() as session, session.begin():
        return await change(session)


def _describe(error: BaseException) -> str:
    # The class and the first line only: a message is shown to operators, a traceback is not.
    text = str(error).strip()
    first = text.splitlines()[0][:300] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _unknown_message(op: OperationRecord) -> str:
    return (
        f"operation {op.key!r} of tenant {op.tenant!r} has an unknown outcome "
        f"({op.last_error}); it is not retried until it is reconciled or resolved"
    )
