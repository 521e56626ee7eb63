"""Running one agent action end to end: begin, execute once, record, retry only when safe.

The action is ``async def action(idempotency_key: str) -> value | ActionResult``; pass the key
on to the downstream as its ``Idempotency-Key``. How its exceptions (from
:mod:`outboxkit.outbox.errors`, shared with consumers' handlers) are read:

- :class:`~outboxkit.outbox.errors.TransientError`: it certainly did not take effect (refused,
  429/503 before processing...). Retried as the :class:`~outboxkit.outbox.retry.RetryPolicy`
  allows; when it gives up, FAILED_FINAL.
- :class:`~outboxkit.outbox.errors.PermanentError`: it certainly did not take effect and never
  will: FAILED_FINAL.
- a timeout, :class:`~outboxkit.outbox.errors.OutcomeUnknownError` or any other exception: it
  may have taken effect. UNKNOWN, never retried until it is reconciled or resolved by a person.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from outboxkit.actions.errors import (
    ActionFailedError,
    ActionInProgressError,
    ActionOutcomeUnknownError,
    LeaseExpiredError,
)
from outboxkit.actions.heartbeat import Heartbeat, LeaseLostError
from outboxkit.actions.reconcile import Reconciler, reconcile_one
from outboxkit.actions.records import Decision, DecisionKind, Lease, OperationRecord
from outboxkit.actions.store import ActionStore, Writer, new_holder
from outboxkit.actions.waiting import OperationWatch, watch_operation
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.driver import driver_session
from outboxkit.outbox.errors import PermanentError, TransientError
from outboxkit.outbox.retry import RetryPolicy
from outboxkit.outbox.secrecy import describe_error
from outboxkit.outbox.unreachable import retry_while_unreachable
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

log = logging.getLogger("outboxkit.actions")

DEFAULT_RETRY = RetryPolicy(
    max_attempts=3, backoff=Backoff(base_s=0.2, cap_s=5.0), max_elapsed_s=300.0
)
"""Three attempts of an operation, 0.2-5 s apart, within five minutes of its first claim."""
DEFAULT_POLL = Backoff(base_s=0.05, cap_s=1.0, floor_s=0.02)
"""How often an operation another worker is running is looked at again (woken earlier by
LISTEN/NOTIFY on PostgreSQL)."""
_T = TypeVar("_T")
LOST_LEASE = "lease lost while the action ran (no heartbeat got through); it may have taken effect"


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
    timeout_s: float,
    retry: RetryPolicy | None = None,
    reconciler: Reconciler | None = None,
    lease_s: float | None = None,
    heartbeat_s: float | None = None,
    wait_in_progress_s: float = 30.0,
    poll_backoff: Backoff | None = None,
    keep_pending_when_exhausted: bool = False,
    refusals: tuple[type[Exception], ...] = (),
) -> ActionOutcome:
    """Run ``action(idempotency_key)`` at most once for ``(tenant, key)``; return the outcome.

    The action gets ``{key}:g{generation}`` (:func:`~outboxkit.actions.records.idempotency_key`)
    to send downstream as its ``Idempotency-Key``. Each step is its own short transaction from
    ``sessions``. ``timeout_s`` bounds one call of the action. The lease (``lease_s``, default
    the store's) is extended every ``heartbeat_s`` (default a third of the lease) while the
    action runs; if the lease is lost meanwhile, the action is cancelled and the operation ends
    UNKNOWN.

    ``retry`` (default :data:`DEFAULT_RETRY`) decides about a
    :class:`~outboxkit.outbox.errors.TransientError`: ``max_attempts`` counts the operation's
    attempts, kept in the database so the count holds across restarts; ``max_elapsed_s`` is
    measured from the operation's first claim (database clock) to the end of the failed call.
    With ``keep_pending_when_exhausted``, giving up leaves the operation PENDING (it certainly did
    not happen) and raises the last :class:`~outboxkit.outbox.errors.TransientError`, for a
    caller with a retry budget of its own (a workflow retries the state later). An exception of
    one of the ``refusals`` classes means the downstream refused before doing anything (an
    expired credential, a policy): the operation stays PENDING, nothing is retried now, and the
    exception propagates as it is.

    Waiting is not retrying: when another worker holds a live lease, the operation is looked
    at again after delays from ``poll_backoff`` (default :data:`DEFAULT_POLL`), or as soon as
    it changes (LISTEN/NOTIFY on PostgreSQL), for up to ``wait_in_progress_s`` seconds, then
    :class:`ActionInProgressError` is raised.

    An UNKNOWN operation found at begin is reconciled once with ``reconciler`` if one is given
    (a restarted agent resumes this way); otherwise, and if it stays UNKNOWN,
    :class:`ActionOutcomeUnknownError` is raised. Also raises :class:`ActionFailedError`,
    :class:`ActionInProgressError` and :class:`OperationConflictError`.
    """
    retry = retry or DEFAULT_RETRY
    poll_backoff = poll_backoff or DEFAULT_POLL
    if not timeout_s > 0:
        raise ValueError("timeout_s must be positive")
    if wait_in_progress_s < 0:
        raise ValueError("wait_in_progress_s must not be negative")
    lease_s = lease_s if lease_s is not None else store.lease_s
    heartbeat_s = heartbeat_s if heartbeat_s is not None else lease_s / 3
    if not heartbeat_s > 0:
        raise ValueError("heartbeat_s must be positive")
    attempt = _Attempt(
        sessions,
        store,
        action,
        timeout_s,
        retry,
        lease_s,
        heartbeat_s,
        keep_pending_when_exhausted,
        refusals,
    )
    holder = new_holder()
    reconciled = False
    # A new key, the common case, is claimed in one autocommitted statement where it can be.
    request: dict[str, Any] = {
        "tenant": tenant,
        "key": key,
        "action_type": action_type,
        "params": params,
        "lease_s": lease_s,
        "holder": holder,
    }
    claimed = await _alone(sessions, lambda session: store.claim_new(session, **request))
    if claimed is not None:
        outcome = await attempt.run(claimed)
        if outcome is not None:
            return outcome
    async with contextlib.AsyncExitStack() as waiting:
        watch: OperationWatch | None = None
        polls = 0
        wait_deadline = 0.0
        while True:
            async with sessions() as session, session.begin():
                db_url = session.get_bind().engine.url
                decision = await store.begin(session, **request)
            op = decision.operation
            if decision.kind is DecisionKind.IN_PROGRESS:
                now = time.monotonic()
                if watch is None:
                    wait_deadline = now + wait_in_progress_s
                    watch = await waiting.enter_async_context(watch_operation(db_url, op.id))
                    continue  # read again now that changes wake us: none can slip in between
                if now >= wait_deadline:
                    raise ActionInProgressError(
                        f"operation {key!r} is still running under {op.lease_holder}", op
                    )
                polls += 1
                await watch.wait(min(poll_backoff.delay(polls), wait_deadline - now))
                continue
            await waiting.aclose()  # done waiting: close the LISTEN connection
            watch, polls = None, 0
            if decision.kind is DecisionKind.SUCCEEDED:
                return ActionOutcome(op, executed=False)
            if decision.kind is DecisionKind.FAILED:
                raise ActionFailedError(f"operation {key!r} failed: {op.last_error}", op)
            if decision.kind is DecisionKind.UNKNOWN:
                if reconciler is not None and not reconciled:
                    reconciled = True
                    actor = f"reconciler:{holder}"
                    await reconcile_one(sessions, store, reconciler, op, actor=actor)
                    continue
                raise ActionOutcomeUnknownError(_unknown_message(op), op)
            outcome = await attempt.run(decision)
            if outcome is not None:
                return outcome


class _Attempt:
    """One claimed attempt: the call under a heartbeat, then its outcome recorded."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        store: ActionStore,
        action: Action,
        timeout_s: float,
        retry: RetryPolicy,
        lease_s: float,
        heartbeat_s: float,
        keep_pending_when_exhausted: bool = False,
        refusals: tuple[type[Exception], ...] = (),
    ) -> None:
        self.keep_pending_when_exhausted = keep_pending_when_exhausted
        self.refusals = refusals
        self.sessions = sessions
        self.store = store
        self.action = action
        self.timeout_s = timeout_s
        self.retry = retry
        self.lease_s = lease_s
        self.heartbeat_s = heartbeat_s

    async def run(self, claimed: Decision) -> ActionOutcome | None:
        """Run one claimed attempt; ``None`` means a transient failure to retry after a pause."""
        lease = claimed.lease
        assert lease is not None
        started = time.monotonic()
        heartbeat = Heartbeat(
            self.sessions, self.store, lease, lease_s=self.lease_s, interval_s=self.heartbeat_s
        )
        try:
            async with heartbeat, asyncio.timeout(self.timeout_s):
                value = await heartbeat.guard(self.action(lease.idempotency_key))
        except LeaseLostError as error:
            op = await self._settle(lease, lambda s: self.store.mark_unknown(s, lease, LOST_LEASE))
            raise ActionOutcomeUnknownError(_unknown_message(op), op) from error
        except TimeoutError as error:
            reason = f"no answer within {self.timeout_s:g}s; the action may have taken effect"
            op = await self._settle(lease, lambda s: self.store.mark_unknown(s, lease, reason))
            raise ActionOutcomeUnknownError(_unknown_message(op), op) from error
        except self.refusals as error:
            message = f"refused: {describe_error(error)}"
            await self._settle(
                lease,
                lambda s: self.store.fail(s, lease, message, final=False, require_live_lease=True),
            )
            raise
        except TransientError as error:
            claim = claimed.operation
            elapsed_s = (claim.updated_ms - claim.created_ms) / 1000 + time.monotonic() - started
            delay = self.retry.next_delay(lease.attempt, elapsed_s)
            message = describe_error(error)
            if delay is None:
                message = (
                    f"gave up after {lease.attempt} attempts in {elapsed_s:.1f}s; last: {message}"
                )
            final = delay is None and not self.keep_pending_when_exhausted
            op = await self._settle(
                lease,
                lambda s: self.store.fail(s, lease, message, final=final, require_live_lease=True),
            )
            if final:
                raise ActionFailedError(f"operation {lease.key!r} failed: {message}", op) from error
            if delay is None:  # kept PENDING: the caller's own budget decides
                raise TransientError(message) from error
            await asyncio.sleep(delay)
            return None
        except PermanentError as error:
            message = describe_error(error)
            op = await self._settle(
                lease,
                lambda s: self.store.fail(s, lease, message, final=True, require_live_lease=True),
            )
            raise ActionFailedError(
                f"operation {lease.key!r} failed: {op.last_error}", op
            ) from error
        except Exception as error:  # OutcomeUnknownError or anything unclassified: never guess
            message = describe_error(error)
            op = await self._settle(lease, lambda s: self.store.mark_unknown(s, lease, message))
            raise ActionOutcomeUnknownError(_unknown_message(op), op) from error
        except BaseException as error:  # cancelled mid-call: the call may have landed
            message = f"cancelled: {describe_error(error)}"
            await asyncio.shield(
                self._settle(lease, lambda s: self.store.mark_unknown(s, lease, message))
            )
            raise
        if isinstance(value, ActionResult):
            result, external_ref = value.value, value.external_ref
        else:
            result, external_ref = value, None

        async def record() -> OperationRecord:
            done = await _alone(
                self.sessions,
                lambda s: self.store.complete_running(
                    s, lease, result=result, external_ref=external_ref
                ),
            )
            if done is not None:
                return done
            return await self._settle(
                lease,
                lambda s: self.store.complete(
                    s, lease, result=result, external_ref=external_ref, require_live_lease=True
                ),
            )

        # The success exists only here now: a failover must not turn it into UNKNOWN.
        op = await retry_while_unreachable(
            record, for_s=self.lease_s or self.store.lease_s, what="an action's success", log=log
        )
        return ActionOutcome(op, executed=True)

    async def _settle(
        self, lease: Lease, change: Callable[[AsyncSession], Awaitable[OperationRecord]]
    ) -> OperationRecord:
        """Record an outcome; a lease that expired meanwhile records UNKNOWN instead."""
        try:
            return await _settle(self.sessions, change)
        except LeaseExpiredError as error:
            op = await _settle(
                self.sessions, lambda s: self.store.mark_unknown(s, lease, LOST_LEASE)
            )
            raise ActionOutcomeUnknownError(_unknown_message(op), op) from error


async def _settle(
    sessions: async_sessionmaker[AsyncSession],
    change: Callable[[AsyncSession], Awaitable[OperationRecord]],
) -> OperationRecord:
    async with sessions() as session, session.begin():
        return await change(session)


async def _alone(
    sessions: async_sessionmaker[AsyncSession],
    write: Callable[[Writer], Awaitable[_T | None]],
) -> _T | None:
    """``write`` (one statement, or ``None`` without writing) in autocommit, where the store
    writes alone on this database; ``None`` there too. No ``BEGIN``/``COMMIT`` round trips;
    on the driver's connection where the database has ``driver_statements``."""
    driver = driver_session(sessions)
    if driver is not None:
        return await write(driver)
    async with sessions() as session:
        if not dialect_of(session).autocommit_statements:
            return None
        await session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        return await write(session)


def _unknown_message(op: OperationRecord) -> str:
    return (
        f"operation {op.key!r} of tenant {op.tenant!r} has an unknown outcome "
        f"({op.last_error}); it is not retried until it is reconciled or resolved"
    )
