"""The ledger's hot statements, built once per database and shape, with named parameters.

A tool call writes twice: a new key claimed (:func:`claim_insert`) and the claim finished
(:func:`finish_update`); a long call also sends heartbeats (:func:`heartbeat_update`). Kept
and run again, a statement costs neither its building nor SQLAlchemy's cache key, which cost
more than the round trip. Where the database writes in one statement, the store runs each
with its audit rows and events (:func:`with_record`): one round trip, atomic without
``BEGIN``/``COMMIT``.
"""

from __future__ import annotations

import functools
from typing import Any

from outboxkit.actions.records import Lease
from outboxkit.actions.states import State
from outboxkit.actions.tables import agent_operation_audit as audit
from outboxkit.actions.tables import agent_operations as ops
from outboxkit.outbox.dialects import Dialect
from outboxkit.outbox.together import one_statement, rows_when
from outboxkit.outbox.writer import rows_after
from sqlalchemy import BigInteger, ColumnElement, Insert, Select, Update, bindparam, update

AUDIT_COLUMNS = (
    "tenant", "op_key", "generation", "attempt", "from_state", "to_state", "actor", "reason",
    "detail",
)  # fmt: skip
"""An audit row's columns given by the store (the database's clock gives ``at_ms``)."""
_LEASE = ("tenant", "op_key", "generation", "attempts", "lease_holder")


def _parameter(name: str, column: str | None = None) -> Any:
    return bindparam(name, type_=ops.c[column or name].type)


def running_under(live_at: ColumnElement[int] | None) -> list[ColumnElement[bool]]:
    """The operation is RUNNING under the lease given by :func:`lease_parameters` (and, with
    ``live_at``, the lease is live then)."""
    conditions = [ops.c[name] == _parameter(f"lease_{name}", name) for name in _LEASE]
    conditions.append(ops.c.state == State.RUNNING.value)
    if live_at is not None:
        conditions.append(ops.c.lease_expires_ms > live_at)
    return conditions


def lease_parameters(lease: Lease) -> dict[str, Any]:
    """The parameters of :func:`running_under`."""
    values = (lease.tenant, lease.key, lease.generation, lease.attempt, lease.holder)
    return {f"lease_{name}": value for name, value in zip(_LEASE, values, strict=True)}


@functools.cache
def claim_insert(dialect: Dialect) -> Insert:
    """A new key claimed: the row RUNNING at attempt 1 of generation 1, unless the key exists.

    Parameters: ``tenant``, ``op_key``, ``action_type``, ``params_hash``, ``lease_holder``,
    ``lease_ms`` and ``ttl_ms``; returns the row (none if the key exists).
    """
    now = dialect.now_ms()
    statement: Insert = (
        dialect.insert(ops)
        .values(
            tenant=_parameter("tenant"),
            op_key=_parameter("op_key"),
            generation=1,
            action_type=_parameter("action_type"),
            params_hash=_parameter("params_hash"),
            state=State.RUNNING.value,
            attempts=1,
            lease_holder=_parameter("lease_holder"),
            lease_expires_ms=now + bindparam("lease_ms", type_=BigInteger),
            needs_attention=False,
            created_ms=now,
            updated_ms=now,
            expires_ms=now + bindparam("ttl_ms", type_=BigInteger),
        )
        .on_conflict_do_nothing(index_elements=["tenant", "op_key"])
        .returning(*ops.c)
    )
    return statement


@functools.cache
def finish_update(
    dialect: Dialect,
    columns: tuple[str, ...],
    live: bool,
    unchanged: tuple[str, ...],
    flush: bool = True,
) -> Update:
    """A claim finished: RUNNING under the lease (live, with ``live``) to ``to_state``.

    Parameters: those of :func:`lease_parameters`, ``to_state``, ``ttl_ms``, and ``set_{name}``
    for each of ``columns``; the lease's expiry is cleared. ``unchanged`` names columns that
    must still hold their value after a claim (``external_ref`` NULL, ``needs_attention``
    false), so a caller may know the row's value without reading it. Without ``flush``, the
    statement's transaction commits without waiting for the disk where the database allows
    (:meth:`Dialect.commit_without_flush`). Returns the row.
    """
    now = dialect.now_ms()
    conditions = running_under(now if live else None)
    for name in unchanged:
        conditions.append(ops.c[name].is_(None if name == "external_ref" else False))
    no_flush = None if flush else dialect.commit_without_flush()
    if no_flush is not None:
        conditions.append(no_flush)
    values: dict[str, Any] = {name: _parameter(f"set_{name}", name) for name in columns}
    values.update(
        state=_parameter("to_state", "state"),
        lease_expires_ms=None,
        updated_ms=now,
        expires_ms=now + bindparam("ttl_ms", type_=BigInteger),
    )
    return update(ops).where(*conditions).values(values).returning(*ops.c)


@functools.cache
def heartbeat_update(dialect: Dialect) -> Update:
    """A live lease extended to now + ``lease_ms`` (parameters of :func:`lease_parameters`)."""
    now = dialect.now_ms()
    return (
        update(ops)
        .where(*running_under(now))
        .values(lease_expires_ms=now + bindparam("lease_ms", type_=BigInteger))
        .returning(ops.c.id)
    )


@functools.cache
def with_record(dialect: Dialect, change: Insert | Update, audits: int, events: int) -> Select[Any]:
    """``change`` with ``audits`` audit rows (parameters ``audit{i}_{column}``) and ``events``
    outbox rows (``event{i}_{column}``), written only if it changed a row: one statement."""
    audit_rows = rows_when(
        dialect, audit, AUDIT_COLUMNS, audits, "audit", fixed=(("at_ms", dialect.now_ms()),)
    )
    return one_statement(change, audit_rows, rows_after(dialect, events, "event"))


__all__ = [
    "AUDIT_COLUMNS",
    "claim_insert",
    "finish_update",
    "heartbeat_update",
    "lease_parameters",
    "running_under",
    "with_record",
]
