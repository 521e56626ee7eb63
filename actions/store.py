"""The operation store: begin, finish, reconcile and resolve, in the caller's transaction.

Every method takes an :class:`AsyncSession` and never commits: the state change, its audit
row and its CloudEvent exist exactly when the caller's transaction commits. Concurrency is
handled by the unique ``(tenant, op_key)`` constraint and by conditional updates (compare and
set on state, generation and attempts), so it is safe under PostgreSQL's READ COMMITTED and
SQLite's serialised writers without holding row locks.
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import socket
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

from cloudevents.core.v1.event import CloudEvent
from outboxkit.actions import events, metrics
from outboxkit.actions.errors import (
    ActionError,
    IllegalTransitionError,
    InvalidActionInputError,
    LeaseExpiredError,
    OperationConflictError,
    OperationNotFoundError,
    StaleLeaseError,
)
from outboxkit.actions.hashing import canonical_json, params_hash
from outboxkit.actions.keys import check_key, check_tenant
from outboxkit.actions.records import (
    Absent,
    AuditEntry,
    Decision,
    DecisionKind,
    Found,
    Lease,
    OperationRecord,
    ReconcileOutcome,
    Resolution,
    Unclear,
)
from outboxkit.actions.statements import (
    claim_insert,
    finish_update,
    heartbeat_update,
    lease_parameters,
    with_record,
)
from outboxkit.actions.states import REPLACEABLE, State, check_transition
from outboxkit.actions.tables import agent_operation_audit as audit
from outboxkit.actions.tables import agent_operations as ops
from outboxkit.outbox.dialects import Dialect, dialect_of
from outboxkit.outbox.driver import DriverSession
from outboxkit.outbox.together import row_parameters
from outboxkit.outbox.writer import Outbox
from sqlalchemy import ColumnElement, Insert, Update, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

DEFAULT_LEASE_S = 30.0
DEFAULT_TTL_S = 24 * 3600.0
_MAX_RACES = 8  # re-reads after losing a compare-and-set; each loss means someone progressed
_RESOLUTION_TARGET = {
    Resolution.SUCCEEDED: State.SUCCEEDED,
    Resolution.FAILED: State.FAILED_FINAL,
    Resolution.RETRY: State.PENDING,
}


def new_holder() -> str:
    """A lease-holder name unique to one claim attempt: host, pid and a random suffix."""
    return f"{_host()}:{os.getpid()}:{secrets.token_hex(4)}"


@functools.cache
def _host() -> str:
    return socket.gethostname()[:40]


class ActionStore:
    """Records agent operations and decides, in code, whether one may run.

    ``lease_s`` is how long (seconds) a claim stays live without an answer or a heartbeat
    (then the operation becomes UNKNOWN, not PENDING; :func:`run_action` extends it while the
    action runs); ``ttl_s`` how long a record is remembered after its last change
    before a begin with the same key may start a new operation. Events go through ``outbox``
    (default: topic ``outboxkit.actions``) with ``source``.

    With ``durable_finish=False``, a success recorded in one statement
    (:meth:`complete_running`) commits without waiting for the database's log flush
    (PostgreSQL: ``synchronous_commit = off`` for that statement alone). The claim always
    waits for it, so an effect never runs unrecorded. A database crash before the next flush
    (the next durable commit on the server, or the WAL writer within about 600 ms) can lose
    the success, its audit row and its event together: the operation is then RUNNING, its
    lease expires, it becomes UNKNOWN and is reconciled by key, never run again.
    """

    def __init__(
        self,
        outbox: Outbox | None = None,
        *,
        source: str = events.DEFAULT_SOURCE,
        lease_s: float = DEFAULT_LEASE_S,
        ttl_s: float = DEFAULT_TTL_S,
        durable_finish: bool = True,
    ) -> None:
        self.outbox = outbox or Outbox(default_topic=events.DEFAULT_TOPIC)
        self.durable_finish = durable_finish
        self.source = source
        self._lease_ms = _positive_ms("lease_s", lease_s)
        self._ttl_ms = _positive_ms("ttl_s", ttl_s)
        self.lease_s = lease_s
        self.ttl_s = ttl_s

    # -- begin ---------------------------------------------------------------------------

    async def begin(
        self,
        session: AsyncSession,
        *,
        tenant: str,
        key: str,
        action_type: str,
        params: Any,
        lease_s: float | None = None,
        holder: str | None = None,
    ) -> Decision:
        """Decide whether this caller may execute the action named by ``(tenant, key)``.

        New key, PENDING, or an expired finished record: claim it (RUNNING under a lease) and
        return EXECUTE. SUCCEEDED / FAILED_FINAL: return the stored outcome. RUNNING under a
        live lease: IN_PROGRESS. RUNNING with an expired lease: it becomes UNKNOWN. UNKNOWN:
        no retry. Other parameters or another action type under the key raise
        :class:`OperationConflictError`, never the old result.
        """
        digest, lease_ms, holder = self._begin_arguments(
            tenant, key, action_type, params, lease_s, holder
        )
        for _ in range(_MAX_RACES):
            # A new key is the common case: insert first, read only when the key exists.
            created = await self._insert(
                session, tenant, key, action_type, digest, lease_ms, holder
            )
            if created is not None:
                return _execute(created)
            op, now = await self._load(session, tenant, key)
            if op is None:
                continue  # removed meanwhile (cleanup): insert again
            if op.state in REPLACEABLE and op.expires_ms <= now:
                op = await self._replace(session, op, action_type, digest, holder)
                if op is None:
                    continue
            elif op.params_hash != digest or op.action_type != action_type:
                metrics.CONFLICTS.inc()
                raise OperationConflictError(
                    f"operation {key!r} of tenant {tenant!r} exists with other parameters or "
                    "another action type; a retry must send exactly the same request"
                )
            if op.state is State.PENDING:
                claimed = await self._claim(session, op, lease_ms, holder)
                if claimed is not None:
                    return _execute(claimed)
                continue
            if op.state is State.RUNNING:
                if op.lease_expires_ms is not None and op.lease_expires_ms <= now:
                    unknown = await self._expire_lease(session, op, holder)
                    if unknown is None:
                        continue
                    return Decision(DecisionKind.UNKNOWN, unknown)
                return Decision(DecisionKind.IN_PROGRESS, op)
            return Decision(_FINISHED_DECISION[op.state], op)
        raise ActionError(f"begin of {key!r} kept losing races; try again")

    async def claim_new(
        self,
        session: Writer,
        *,
        tenant: str,
        key: str,
        action_type: str,
        params: Any,
        lease_s: float | None = None,
        holder: str | None = None,
    ) -> Decision | None:
        """Claim ``(tenant, key)`` if no operation has it yet, in one statement (the row, its
        audit and its events); ``None`` when the key exists or :meth:`writes_alone` is false
        (then :meth:`begin`, in a transaction, decides).

        One statement is atomic without a transaction: :func:`run_action` sends it in
        autocommit, one round trip for the common case of a new key.
        """
        digest, lease_ms, holder = self._begin_arguments(
            tenant, key, action_type, params, lease_s, holder
        )
        if not self.writes_alone(session):
            return None
        created = await self._insert(session, tenant, key, action_type, digest, lease_ms, holder)
        return None if created is None else _execute(created)

    def writes_alone(self, session: Writer) -> bool:
        """True when :meth:`claim_new` and :meth:`complete_running` write in one statement on
        this session's database, safe in autocommit: PostgreSQL, with an outbox of rows (WAL
        messages cannot go in a statement's CTE)."""
        dialect = _dialect(session)
        return (
            dialect.writes_in_one_statement
            and dialect.autocommit_statements
            and not (self.outbox.wal_messages and dialect.logical_replication)
        )

    def _begin_arguments(
        self,
        tenant: str,
        key: str,
        action_type: str,
        params: Any,
        lease_s: float | None,
        holder: str | None,
    ) -> tuple[str, int, str]:
        """The checked arguments of a begin: the parameters' hash, the lease (ms), the holder."""
        check_tenant(tenant)
        check_key(key)
        _check_text("action_type", action_type, 128)
        digest = params_hash(params)
        lease_ms = self._lease_ms if lease_s is None else _positive_ms("lease_s", lease_s)
        return digest, lease_ms, _check_text("holder", holder or new_holder(), 64)

    async def _insert(
        self,
        session: Writer,
        tenant: str,
        key: str,
        action_type: str,
        digest: str,
        lease_ms: int,
        holder: str,
    ) -> OperationRecord | None:
        check_transition(None, State.PENDING)
        check_transition(State.PENDING, State.RUNNING)
        parameters = {
            "tenant": tenant,
            "op_key": key,
            "action_type": action_type,
            "params_hash": digest,
            "lease_holder": holder,
            "lease_ms": lease_ms,
            "ttl_ms": self._ttl_ms,
        }
        expected = _as_written(
            tenant=tenant,
            key=key,
            generation=1,
            action_type=action_type,
            params_hash=digest,
            state=State.RUNNING,
            attempts=1,
            lease_holder=holder,
        )
        # None: someone else inserted it first; the caller re-reads
        return await self._write(
            session,
            claim_insert(_dialect(session)),
            parameters,
            lambda created: (
                _Change(created, None, State.PENDING, 0, events.REQUESTED, holder, "requested"),
                _Change(
                    created,
                    State.PENDING,
                    State.RUNNING,
                    1,
                    events.STARTED,
                    holder,
                    f"claimed for attempt 1 with a lease of {lease_ms / 1000:g} s",
                ),
            ),
            expected,
        )

    async def _replace(
        self,
        session: AsyncSession,
        op: OperationRecord,
        action_type: str,
        digest: str,
        holder: str,
    ) -> OperationRecord | None:
        now = dialect_of(session).now_ms()
        return await self._transition(
            session,
            op,
            State.PENDING,
            event_type=events.REQUESTED,
            actor=holder,
            reason=(
                f"generation {op.generation} expired at {op.expires_ms} in state {op.state}; "
                f"replaced by generation {op.generation + 1}"
            ),
            values={
                "generation": op.generation + 1,
                "action_type": action_type,
                "params_hash": digest,
                "attempts": 0,
                "lease_holder": None,
                "lease_expires_ms": None,
                "result": None,
                "external_ref": None,
                "last_error": None,
                "needs_attention": False,
                "created_ms": now,
            },
            where=[ops.c.expires_ms <= now],
            detail={"replaced": op.to_json()},
            new_generation=True,
        )

    async def _claim(
        self, session: AsyncSession, op: OperationRecord, lease_ms: int, holder: str
    ) -> OperationRecord | None:
        now = dialect_of(session).now_ms()
        return await self._transition(
            session,
            op,
            State.RUNNING,
            event_type=events.STARTED,
            actor=holder,
            reason=f"claimed for attempt {op.attempts + 1} with a lease of {lease_ms / 1000:g} s",
            values={
                "attempts": op.attempts + 1,
                "lease_holder": holder,
                "lease_expires_ms": now + lease_ms,
                "needs_attention": False,
            },
        )

    async def _expire_lease(
        self, session: AsyncSession, op: OperationRecord, actor: str
    ) -> OperationRecord | None:
        now = dialect_of(session).now_ms()
        return await self._transition(
            session,
            op,
            State.UNKNOWN,
            event_type=events.UNKNOWN,
            actor=actor,
            reason=(
                f"lease of {op.lease_holder} expired at {op.lease_expires_ms} without an answer; "
                "the side effect may have happened"
            ),
            values={"last_error": "lease expired without an answer"},
            where=[ops.c.lease_expires_ms <= now],
        )

    # -- finishing (fenced by the lease) -----------------------------------------------------

    async def complete(
        self,
        session: AsyncSession,
        lease: Lease,
        *,
        result: Any = None,
        external_ref: str | None = None,
        require_live_lease: bool = False,
    ) -> OperationRecord:
        """Record success with its JSON ``result`` and the external system's reference.

        Accepted from RUNNING, and from UNKNOWN when the lease expired but this holder still
        learned the outcome, unless ``require_live_lease``: then an expired lease raises
        :class:`LeaseExpiredError` (the runner's rule: a worker that lost its lease records
        nothing but UNKNOWN). Repeating it is a no-op; a stale lease raises
        :class:`StaleLeaseError`.
        """
        target, event_type, reason, values = self._success(result, external_ref)
        return await self._finish(
            session, lease, target, event_type, reason, values,
            require_live_lease=require_live_lease,
        )  # fmt: skip

    @staticmethod
    def _success(result: Any, external_ref: str | None) -> tuple[State, str, str, dict[str, Any]]:
        """A success's target, event type, reason and column values, checked."""
        stored = None if result is None else canonical_json(result)
        if external_ref is not None:
            _check_text("external_ref", external_ref, 256)
        values = {
            "result": stored,
            "external_ref": external_ref,
            "last_error": None,
            "needs_attention": False,
        }
        return State.SUCCEEDED, events.SUCCEEDED, "completed", values

    async def fail(
        self,
        session: AsyncSession,
        lease: Lease,
        error: str,
        *,
        final: bool,
        require_live_lease: bool = False,
    ) -> OperationRecord:
        """Record a failure: ``final`` ends in FAILED_FINAL, otherwise back to PENDING.

        A transient failure must mean the side effect certainly did not happen; its attempt
        stays counted and a later begin may claim the operation again. ``require_live_lease``
        as for :meth:`complete`.
        """
        error = _check_text("error", error, 2000, truncate=True)
        target = State.FAILED_FINAL if final else State.PENDING
        reason = f"failed: {error}" if final else f"failed transiently: {error}"
        return await self._finish(
            session,
            lease,
            target,
            events.FAILED,
            reason,
            {"last_error": error, "needs_attention": False},
            require_live_lease=require_live_lease,
        )

    async def mark_unknown(
        self, session: AsyncSession, lease: Lease, reason: str
    ) -> OperationRecord:
        """Record that the outcome is unknown (e.g. a timeout after a possible commit)."""
        reason = _check_text("reason", reason, 2000, truncate=True)
        return await self._finish(
            session, lease, State.UNKNOWN, events.UNKNOWN, reason, {"last_error": reason}
        )

    async def _finish(
        self,
        session: AsyncSession,
        lease: Lease,
        target: State,
        event_type: str,
        reason: str,
        values: dict[str, Any],
        *,
        require_live_lease: bool = False,
    ) -> OperationRecord:
        done = await self._finish_running(
            session, lease, target, event_type, reason, values, require_live_lease
        )
        if done is not None:
            return done
        for _ in range(_MAX_RACES):
            op, now = await self._load(session, lease.tenant, lease.key)
            if (
                op is None
                or op.generation != lease.generation
                or op.attempts != lease.attempt
                or op.lease_holder != lease.holder
            ):
                raise StaleLeaseError(
                    f"lease on {lease.key!r} attempt {lease.attempt} no longer owns the operation"
                )
            if op.state is target:
                return op  # a repeated call, e.g. after a lost database reply
            sources = (
                (State.RUNNING,) if target is State.UNKNOWN else (State.RUNNING, State.UNKNOWN)
            )
            if op.state not in sources:
                raise StaleLeaseError(
                    f"operation {lease.key!r} is {op.state}; it cannot become {target} "
                    "through this lease"
                )
            live = op.state is State.RUNNING and (op.lease_expires_ms or 0) > now
            if require_live_lease and not live:
                raise LeaseExpiredError(
                    f"lease on {lease.key!r} attempt {lease.attempt} expired before the outcome "
                    "was recorded"
                )
            late = "" if op.state is State.RUNNING else " (after its lease expired)"
            done = await self._transition(
                session,
                op,
                target,
                event_type=event_type,
                actor=lease.holder,
                reason=reason + late,
                values={**values, "lease_expires_ms": None},
                where=[ops.c.lease_expires_ms > dialect_of(session).now_ms()]
                if require_live_lease
                else None,
            )
            if done is not None:
                return done
        raise StaleLeaseError(f"operation {lease.key!r} kept changing under this lease")

    async def _finish_running(
        self,
        session: Writer,
        lease: Lease,
        target: State,
        event_type: str,
        reason: str,
        values: dict[str, Any],
        require_live_lease: bool,
        flush: bool = True,
    ) -> OperationRecord | None:
        """The common finish in one statement: the operation is RUNNING under ``lease``
        (live, if required). ``None``: it is not, and :meth:`_finish` reads it to say why.
        ``flush=False``: see ``durable_finish``.

        A lease from a begin knows what the row will hold, so the update, its audit row and
        its event are one statement where the database allows; the event's fields the finish
        does not set are required to be their values after a claim.
        """
        check_transition(State.RUNNING, target)
        columns = tuple(sorted(name for name in values if name != "lease_expires_ms"))
        unchanged = tuple(
            name for name in ("external_ref", "needs_attention") if name not in values
        )
        statement = finish_update(_dialect(session), columns, require_live_lease, unchanged, flush)
        parameters = {
            **lease_parameters(lease),
            **{f"set_{name}": values[name] for name in columns},
            "to_state": target.value,
            "ttl_ms": self._ttl_ms,
        }
        expected = None
        if lease.action_type is not None and lease.params_hash is not None:
            expected = _as_written(
                tenant=lease.tenant,
                key=lease.key,
                generation=lease.generation,
                action_type=lease.action_type,
                params_hash=lease.params_hash,
                state=target,
                attempts=lease.attempt,
                lease_holder=lease.holder,
                external_ref=values.get("external_ref"),
                needs_attention=bool(values.get("needs_attention")),
            )
        changed = await self._write(
            session,
            statement,
            parameters,
            lambda op: (
                _Change(op, State.RUNNING, target, op.attempts, event_type, lease.holder, reason),
            ),
            expected,
        )
        if changed is not None:
            _observe_time_in_state(State.RUNNING, target, lease.claimed_ms, changed)
        return changed

    async def complete_running(
        self,
        session: Writer,
        lease: Lease,
        *,
        result: Any = None,
        external_ref: str | None = None,
    ) -> OperationRecord | None:
        """Record success if the operation is RUNNING under ``lease``, live, in one statement;
        ``None`` when it is not or :meth:`writes_alone` is false (then :meth:`complete` with
        ``require_live_lease``, in a transaction, says why or records it).

        Safe in autocommit, as :meth:`claim_new` is: :func:`run_action` sends it that way.
        """
        if not self.writes_alone(session) or lease.action_type is None:
            return None
        target, event_type, reason, values = self._success(result, external_ref)
        return await self._finish_running(
            session,
            lease,
            target,
            event_type,
            reason,
            values,
            require_live_lease=True,
            flush=self.durable_finish,
        )

    async def extend_lease(self, session: AsyncSession, lease: Lease, lease_s: float) -> bool:
        """A heartbeat: move a live lease's expiry to ``now + lease_s`` (database clock).

        A compare-and-set on the lease (tenant, key, generation, attempt, holder, RUNNING, not
        yet expired); no state change, so no audit row and no event. False means the lease is
        lost: it expired (a sweep or a begin may already have made the operation UNKNOWN), or
        the operation was resolved, reclaimed or replaced.
        """
        parameters = {**lease_parameters(lease), "lease_ms": _positive_ms("lease_s", lease_s)}
        statement = heartbeat_update(dialect_of(session))
        return (await session.execute(statement, parameters)).first() is not None

    # -- reconciliation and manual resolution ------------------------------------------------

    async def reconcile(
        self,
        session: AsyncSession,
        operation: OperationRecord,
        outcome: ReconcileOutcome,
        *,
        actor: str = "reconciler",
    ) -> OperationRecord:
        """Apply a reconciler's answer to an UNKNOWN operation as read in ``operation``.

        Found: SUCCEEDED with its result. Absent: PENDING (safe to retry). Unclear: stays
        UNKNOWN with ``needs_attention`` set (once). If the operation changed since it was read
        (resolved, replaced), nothing is written and the current record is returned.
        """
        actor = _check_text("actor", actor, 128)
        op, now = await self._load(session, operation.tenant, operation.key)
        if op is None or (op.generation, op.attempts) != (operation.generation, operation.attempts):
            return op if op is not None else operation
        if op.state is State.RUNNING and op.lease_expires_ms is not None:
            if op.lease_expires_ms > now:
                return op
            op = await self._expire_lease(session, op, actor)
            if op is None:
                return operation
        if op.state is not State.UNKNOWN:
            return op
        if isinstance(outcome, Found):
            stored = None if outcome.result is None else canonical_json(outcome.result)
            if outcome.external_ref is not None:
                _check_text("external_ref", outcome.external_ref, 256)
            changed = await self._transition(
                session,
                op,
                State.SUCCEEDED,
                event_type=events.RECONCILED,
                actor=actor,
                reason="reconciled: found in the external system",
                values={
                    "result": stored,
                    "external_ref": outcome.external_ref,
                    "last_error": None,
                    "needs_attention": False,
                    "lease_expires_ms": None,
                },
                detail={"outcome": "found"},
            )
        elif isinstance(outcome, Absent):
            changed = await self._transition(
                session,
                op,
                State.PENDING,
                event_type=events.RECONCILED,
                actor=actor,
                reason=f"reconciled: {outcome.reason}",
                values={"needs_attention": False, "lease_expires_ms": None},
                detail={"outcome": "absent"},
            )
        elif isinstance(outcome, Unclear):
            if op.needs_attention:
                return op
            reason = _check_text("reason", outcome.reason or "unclear", 2000, truncate=True)
            changed = await self._transition(
                session,
                op,
                State.UNKNOWN,
                event_type=events.FLAGGED,
                actor=actor,
                reason=f"reconcile unclear, flagged for a person: {reason}",
                values={"needs_attention": True, "last_error": reason},
                detail={"outcome": "unclear"},
            )
        else:
            raise InvalidActionInputError(
                f"a reconciler returns Found, Absent or Unclear, not {type(outcome).__name__}"
            )
        if changed is None:
            current, _ = await self._load(session, op.tenant, op.key)
            return current or op
        return changed

    async def resolve(
        self,
        session: AsyncSession,
        *,
        tenant: str,
        key: str,
        resolution: Resolution,
        by: str,
        reason: str,
        result: Any = None,
        external_ref: str | None = None,
    ) -> OperationRecord:
        """An operator's decision, audited with ``by`` and ``reason``.

        From UNKNOWN: SUCCEEDED (with ``result``), FAILED (FAILED_FINAL) or RETRY (PENDING: the
        next begin executes again; safe only if the downstream honours the Idempotency-Key or
        the action is known not to have happened). From PENDING: FAILED only. A RUNNING
        operation under a live lease cannot be resolved.
        """
        check_tenant(tenant)
        check_key(key)
        by = _check_text("by", by, 128)
        reason = _check_text("reason", reason, 2000)
        resolution = Resolution(resolution)
        stored = None if result is None else canonical_json(result)
        if result is not None and resolution is not Resolution.SUCCEEDED:
            raise InvalidActionInputError("a result can only be given with 'succeeded'")
        if external_ref is not None:
            _check_text("external_ref", external_ref, 256)
        op, now = await self._load(session, tenant, key)
        if op is None:
            raise OperationNotFoundError(f"no operation {key!r} for tenant {tenant!r}")
        if op.state is State.RUNNING:
            if op.lease_expires_ms is not None and op.lease_expires_ms > now:
                raise IllegalTransitionError(
                    f"operation {key!r} is RUNNING under the live lease of {op.lease_holder}; "
                    "wait for it to finish or for the lease to expire"
                )
            op = await self._expire_lease(session, op, by)
            if op is None:
                raise IllegalTransitionError(f"operation {key!r} changed concurrently; retry")
        target = _RESOLUTION_TARGET[resolution]
        check_transition(op.state, target)
        values: dict[str, Any] = {"needs_attention": False, "lease_expires_ms": None}
        if resolution is Resolution.SUCCEEDED:
            values.update(result=stored, external_ref=external_ref, last_error=None)
        elif resolution is Resolution.FAILED:
            values["last_error"] = f"resolved as failed by {by}: {reason}"
        event_type = events.RECONCILED if op.state is State.UNKNOWN else events.FAILED
        changed = await self._transition(
            session,
            op,
            target,
            event_type=event_type,
            actor=by,
            reason=f"resolved by hand ({resolution}): {reason}",
            values=values,
            detail={"outcome": "manual", "resolution": resolution.value},
        )
        if changed is None:
            raise IllegalTransitionError(f"operation {key!r} changed concurrently; retry")
        return changed

    async def sweep_expired_leases(
        self, session: AsyncSession, *, limit: int = 100, actor: str = "lease-sweeper"
    ) -> list[OperationRecord]:
        """Turn RUNNING operations whose lease expired (database clock) into UNKNOWN."""
        now = dialect_of(session).now_ms()
        rows = (
            await session.execute(
                select(ops)
                .where(ops.c.state == State.RUNNING.value, ops.c.lease_expires_ms <= now)
                .order_by(ops.c.lease_expires_ms)
                .limit(limit)
            )
        ).mappings()
        swept = []
        for row in list(rows):
            unknown = await self._expire_lease(session, OperationRecord.from_row(row), actor)
            if unknown is not None:
                swept.append(unknown)
        return swept

    async def mark_awaiting_decision(
        self, session: AsyncSession, tenant: str, key: str, awaiting: bool
    ) -> bool:
        """Flag ``key`` of ``tenant`` as waiting for a person's decision (``awaiting``), or
        no longer; not a state change. ``False`` when there is no such operation."""
        result = await session.execute(
            update(ops)
            .where(ops.c.tenant == check_tenant(tenant), ops.c.op_key == check_key(key))
            .values(awaiting_decision=True if awaiting else None)
        )
        return bool(getattr(result, "rowcount", 0))

    # -- reading -----------------------------------------------------------------------------

    async def get(self, session: AsyncSession, tenant: str, key: str) -> OperationRecord | None:
        """The operation ``key`` of ``tenant``, or ``None``; never another tenant's."""
        op, _ = await self._load(session, check_tenant(tenant), check_key(key))
        return op

    async def history(self, session: AsyncSession, tenant: str, key: str) -> list[AuditEntry]:
        """The audit trail of ``key`` of ``tenant`` (all generations), oldest first."""
        rows = await session.execute(
            select(audit)
            .where(audit.c.tenant == check_tenant(tenant), audit.c.op_key == check_key(key))
            .order_by(audit.c.id)
        )
        return [AuditEntry.from_row(row) for row in rows.mappings()]

    async def list_operations(
        self,
        session: AsyncSession,
        *,
        tenant: str | None = None,
        state: State | None = None,
        older_than_s: float | None = None,
        needs_attention: bool | None = None,
        limit: int = 100,
        tenants: Collection[str] | None = None,
    ) -> list[OperationRecord]:
        """Operations filtered by tenant, state, age of the last state change (at least
        ``older_than_s`` seconds ago, database clock) and flag; ``tenants``: only those tenants'
        (``None``: any)."""
        now = dialect_of(session).now_ms()
        query = select(ops).order_by(ops.c.updated_ms, ops.c.id).limit(limit)
        if tenant is not None:
            query = query.where(ops.c.tenant == check_tenant(tenant))
        if tenants is not None:
            query = query.where(ops.c.tenant.in_(sorted(tenants)))
        if state is not None:
            query = query.where(ops.c.state == State(state).value)
        if older_than_s is not None:
            query = query.where(ops.c.updated_ms <= now - round(older_than_s * 1000))
        if needs_attention is not None:
            query = query.where(ops.c.needs_attention == needs_attention)
        rows = await session.execute(query)
        return [OperationRecord.from_row(row) for row in rows.mappings()]

    async def _load(
        self, session: AsyncSession, tenant: str, key: str
    ) -> tuple[OperationRecord | None, int]:
        now = dialect_of(session).now_ms().label("now_ms")
        row = (
            (
                await session.execute(
                    select(ops, now).where(ops.c.tenant == tenant, ops.c.op_key == key)
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            return None, 0
        return OperationRecord.from_row(row), row["now_ms"]

    # -- the one place a state changes -----------------------------------------------------

    async def _transition(
        self,
        session: AsyncSession,
        op: OperationRecord,
        target: State,
        *,
        event_type: str,
        actor: str,
        reason: str,
        values: dict[str, Any] | None = None,
        where: list[ColumnElement[bool]] | None = None,
        detail: Any = None,
        new_generation: bool = False,
    ) -> OperationRecord | None:
        """Compare-and-set ``op`` (as read) to ``target``; audit and emit; ``None`` if lost."""
        as_read = [
            ops.c.id == op.id,
            ops.c.state == op.state.value,
            ops.c.generation == op.generation,
            ops.c.attempts == op.attempts,
            *(where or []),
        ]
        return await self._compare_and_set(
            session,
            as_read,
            op.state,
            op.updated_ms,
            target,
            event_type=event_type,
            actor=actor,
            reason=reason,
            values=values,
            detail=detail,
            new_generation=new_generation,
        )

    async def _compare_and_set(
        self,
        session: AsyncSession,
        conditions: list[ColumnElement[bool]],
        from_state: State,
        entered_ms: int | None,
        target: State,
        *,
        event_type: str,
        actor: str,
        reason: str,
        values: dict[str, Any] | None = None,
        detail: Any = None,
        new_generation: bool = False,
    ) -> OperationRecord | None:
        """Move the operation matching ``conditions`` (in ``from_state``, entered at
        ``entered_ms``) to ``target``; audit and emit; ``None`` if no row matched."""
        check_transition(from_state, target, new_generation=new_generation)
        now = dialect_of(session).now_ms()
        changes: dict[str, Any] = {"state": target.value, "expires_ms": now + self._ttl_ms}
        if target is not from_state or new_generation:
            changes["updated_ms"] = now  # updated_ms is the time of the last state change
        changes.update(values or {})
        statement = update(ops).where(*conditions).values(changes).returning(*ops.c)
        changed = await self._write(
            session,
            statement,
            {},
            lambda op: (
                _Change(op, from_state, target, op.attempts, event_type, actor, reason, detail),
            ),
        )
        if changed is None:
            return None
        _observe_time_in_state(from_state, target, entered_ms, changed)
        return changed

    async def _write(
        self,
        session: Writer,
        change: Insert | Update,
        parameters: dict[str, Any],
        changes_of: Callable[[OperationRecord], Sequence[_Change]],
        expected: OperationRecord | None = None,
    ) -> OperationRecord | None:
        """Run ``change`` (``RETURNING`` the row) with ``parameters`` and the audit rows and
        events of ``changes_of(row)``; ``None`` (nothing written) if it changed no row.

        With ``expected``, the row as ``change`` will leave it in every field an audit row or
        an event reads, ``change`` a statement kept for reuse (:mod:`.statements`) and a
        database that writes in one statement, all of it is one statement, the audit rows and
        events built from ``expected`` before it runs. Otherwise the change runs first and
        they follow in the session's transaction.
        """
        dialect = _dialect(session)
        if expected is not None and dialect.writes_in_one_statement:
            changes = changes_of(expected)
            event_rows = self.outbox.rows_for(dialect, self._events(changes))
            if event_rows is not None:
                audit_rows = _audit_rows(changes)
                statement = with_record(dialect, change, len(audit_rows), len(event_rows))
                parameters = {
                    **parameters,
                    **row_parameters("audit", audit_rows),
                    **row_parameters("event", event_rows),
                }
                if isinstance(session, DriverSession):
                    row = await session.first(statement, parameters)
                else:
                    row = (await session.execute(statement, parameters)).mappings().first()
                if row is None:
                    return None
                _count_transitions(changes)
                return OperationRecord.from_row(row)
        if isinstance(session, DriverSession):
            raise TypeError("a DriverSession writes only what writes_alone() allows")
        row = (await session.execute(change, parameters)).mappings().first()
        if row is None:
            return None
        written = OperationRecord.from_row(row)
        await self._record(session, *changes_of(written))
        return written

    async def _record(self, session: AsyncSession, *changes: _Change) -> None:
        """Audit ``changes`` and add their CloudEvents: one statement each, whatever the count."""
        at_ms = dialect_of(session).now_ms()
        await session.execute(insert(audit).values(at_ms=at_ms), _audit_rows(changes))
        await self.outbox.add_all_async(session, self._events(changes))
        _count_transitions(changes)

    def _events(self, changes: Sequence[_Change]) -> list[CloudEvent]:
        return [
            events.transition_event(
                source=self.source,
                event_type=change.event_type,
                operation=change.op,
                attempt=change.attempt,
                from_state=change.from_state,
                to=change.to,
                actor=change.actor,
                reason=change.reason,
            )
            for change in changes
        ]


Writer = AsyncSession | DriverSession
"""Where a store method writes: a session (in its transaction), or, for the one-statement
writes :meth:`ActionStore.writes_alone` allows, a driver session (each statement committed
alone)."""


def _dialect(session: Writer) -> Dialect:
    return dialect_of(session.dialect if isinstance(session, DriverSession) else session)


class _Change(NamedTuple):
    """One state change to audit and publish."""

    op: OperationRecord
    from_state: State | None
    to: State
    attempt: int
    event_type: str
    actor: str
    reason: str
    detail: Any = None


_FINISHED_DECISION = {
    State.SUCCEEDED: DecisionKind.SUCCEEDED,
    State.FAILED_FINAL: DecisionKind.FAILED,
    State.UNKNOWN: DecisionKind.UNKNOWN,
}


def _audit_rows(changes: Sequence[_Change]) -> list[dict[str, Any]]:
    """The audit rows of ``changes`` (the database's clock adds ``at_ms``)."""
    return [
        {
            "tenant": change.op.tenant,
            "op_key": change.op.key,
            "generation": change.op.generation,
            "attempt": change.attempt,
            "from_state": change.from_state.value if change.from_state else None,
            "to_state": change.to.value,
            "actor": change.actor[:128],
            "reason": change.reason,
            "detail": None if change.detail is None else canonical_json(change.detail),
        }
        for change in changes
    ]


def _as_written(
    *,
    tenant: str,
    key: str,
    generation: int,
    action_type: str,
    params_hash: str,
    state: State,
    attempts: int,
    lease_holder: str,
    external_ref: str | None = None,
    needs_attention: bool = False,
) -> OperationRecord:
    """The fields of a row about to be written that its audit rows and events read; the row's
    id, times, lease expiry, result and error are the database's (left 0 and None here)."""
    return OperationRecord(
        id=0,
        tenant=tenant,
        key=key,
        generation=generation,
        action_type=action_type,
        params_hash=params_hash,
        state=state,
        attempts=attempts,
        lease_holder=lease_holder,
        lease_expires_ms=None,
        result=None,
        external_ref=external_ref,
        last_error=None,
        needs_attention=needs_attention,
        created_ms=0,
        updated_ms=0,
        expires_ms=0,
    )


def _observe_time_in_state(
    from_state: State, target: State, entered_ms: int | None, changed: OperationRecord
) -> None:
    left = from_state in (State.RUNNING, State.UNKNOWN) and target is not from_state
    if left and entered_ms is not None:
        spent_s = max(0, changed.updated_ms - entered_ms) / 1000
        metrics.STATE_SECONDS.labels(from_state.value).observe(spent_s)


def _count_transitions(changes: Sequence[_Change]) -> None:
    for change in changes:
        from_state, to, detail = change.from_state, change.to, change.detail
        metrics.TRANSITIONS.labels(from_state.value if from_state else "NEW", to.value).inc()
        if isinstance(detail, dict) and detail.get("outcome") in ("found", "absent", "unclear"):
            metrics.RECONCILIATIONS.labels(detail["outcome"]).inc()
        if isinstance(detail, dict) and detail.get("outcome") == "manual":
            metrics.RESOLUTIONS.labels(detail.get("resolution", "?")).inc()


def _execute(op: OperationRecord) -> Decision:
    lease = Lease(
        op.tenant,
        op.key,
        op.generation,
        op.attempts,
        op.lease_holder or "",
        op.updated_ms,
        op.action_type,
        op.params_hash,
    )
    return Decision(DecisionKind.EXECUTE, op, lease)


def _positive_ms(name: str, seconds: float) -> int:
    """``seconds`` as whole milliseconds (the columns' unit), at least 1."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < 0.001
    ):
        raise InvalidActionInputError(f"{name} must be a number of seconds, at least 0.001")
    return round(seconds * 1000)


def _check_text(name: str, value: str, limit: int, *, truncate: bool = False) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidActionInputError(f"{name} must be a non-empty string")
    if len(value) > limit:
        if not truncate:
            raise InvalidActionInputError(f"{name} is longer than {limit} characters")
        return value[: limit - 3] + "..."
    return value
