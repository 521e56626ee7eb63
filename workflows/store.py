"""SQL of durable workflows: instances, history and signals, inside the caller's transaction.

Nothing here commits or decides: the engine (:mod:`outboxkit.workflows.engine`) decides, and
writes each decision with its history record and its event in one transaction.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypedDict, Unpack

from outboxkit.outbox.dialects import dialect_of
from outboxkit.workflows.records import HistoryRecord, SignalRecord, Status, WorkflowRecord
from outboxkit.workflows.tables import (
    DUE_MS,
    DUE_STATUSES,
    workflow_history,
    workflow_instances,
    workflow_signals,
)
from sqlalchemy import Select, String, Table, and_, func, literal, or_, select, text, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

NOTIFY_CHANNEL = "outboxkit_workflows"
"""PostgreSQL channel notified when an instance becomes runnable (workers LISTEN on it)."""


def dumps(value: Any) -> str:
    """JSON text as the tables store it."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


async def insert_instance(session: AsyncSession, values: Mapping[str, Any]) -> bool:
    """Insert an instance unless ``(tenant, workflow_id)`` exists; True if inserted."""
    statement = (
        dialect_of(session)
        .insert_or_skip(
            workflow_instances, ["tenant", "workflow_id"], returning=[workflow_instances.c.id]
        )
        .values(**values)
    )
    return (await session.execute(statement)).first() is not None


async def get(
    session: AsyncSession, tenant: str, workflow_id: str, *, lock: bool = False
) -> WorkflowRecord | None:
    """The instance, or ``None``; ``lock`` takes its row lock (PostgreSQL) for the transaction."""
    query = select(workflow_instances).where(
        workflow_instances.c.tenant == tenant, workflow_instances.c.workflow_id == workflow_id
    )
    if lock:
        query = dialect_of(session).lock(query)
    row = (await session.execute(query)).mappings().first()
    return None if row is None else WorkflowRecord.from_row(row)


async def update_instance(session: AsyncSession, record_id: int, values: Mapping[str, Any]) -> None:
    """Write ``values`` to the instance ``record_id``."""
    await session.execute(
        update(workflow_instances).where(workflow_instances.c.id == record_id).values(**values)
    )


async def claim_due(
    session: AsyncSession, *, holder: str, now_ms: int, lease_ms: int, limit: int
) -> list[WorkflowRecord]:
    """Lease up to ``limit`` instances with work due at ``now_ms`` (engine clock).

    Due: runnable with ``run_at_ms`` reached, or waiting past the wait's deadline; and not
    leased, or leased by a worker whose lease ran out (database clock). Several workers claim
    side by side: on PostgreSQL, ``FOR UPDATE SKIP LOCKED`` keeps them off each other's rows.
    """
    dialect = dialect_of(session)
    db_now = dialect.now_ms()
    table = workflow_instances
    due = (
        select(table.c.id)
        .where(
            or_(
                and_(table.c.status == Status.RUNNABLE.value, table.c.run_at_ms <= now_ms),
                and_(table.c.status == Status.WAITING.value, table.c.wait_deadline_ms <= now_ms),
            ),
            or_(table.c.lease_holder.is_(None), table.c.lease_expires_ms < db_now),
        )
        .order_by(table.c.run_at_ms)
        .limit(limit)
    )
    due = dialect.claim_skip_locked(due)
    statement = (
        update(table)
        .where(table.c.id.in_(due.scalar_subquery()))
        .values(lease_holder=holder, lease_expires_ms=db_now + lease_ms)
        .returning(*table.c)
    )
    rows = (await session.execute(statement)).mappings().all()
    return [WorkflowRecord.from_row(row) for row in rows]


async def release(session: AsyncSession, record_id: int, holder: str) -> None:
    """Give up the lease ``holder`` has on an instance (nothing if it has none)."""
    await session.execute(
        update(workflow_instances)
        .where(workflow_instances.c.id == record_id, workflow_instances.c.lease_holder == holder)
        .values(lease_holder=None, lease_expires_ms=None)
    )


async def append_history(session: AsyncSession, values: Mapping[str, Any]) -> None:
    """Append one history record (``(tenant, workflow_id, seq)`` is unique)."""
    await session.execute(workflow_history.insert().values(**values))


async def history(session: AsyncSession, tenant: str, workflow_id: str) -> list[HistoryRecord]:
    """The instance's history, oldest first."""
    rows = (
        await session.execute(
            select(workflow_history)
            .where(
                workflow_history.c.tenant == tenant, workflow_history.c.workflow_id == workflow_id
            )
            .order_by(workflow_history.c.seq)
        )
    ).mappings()
    return [HistoryRecord.from_row(row) for row in rows]


def column_lengths(table: Table) -> dict[str, int]:
    """The length of each of ``table``'s bounded text columns, by name."""
    return {
        column.name: column.type.length
        for column in table.columns
        if isinstance(column.type, String) and column.type.length
    }


SIGNAL_LENGTHS = column_lengths(workflow_signals)
"""What ``workflow_signals`` holds of each text attribute of a signal."""


def too_long(values: Mapping[str, Any], lengths: Mapping[str, int]) -> dict[str, int]:
    """The text values longer than their column, with their length."""
    return {
        name: len(value)
        for name, value in values.items()
        if isinstance(value, str) and name in lengths and len(value) > lengths[name]
    }


def fit(value: str, length: int) -> str:
    """``value`` if it fits in ``length`` characters, else its start, ``#`` and its SHA-256
    (hex), so two values cut alike stay apart."""
    if len(value) <= length:
        return value
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()
    if length < len(digest) + 2:
        return ("#" + digest)[:length]
    return value[: length - len(digest) - 1] + "#" + digest


async def insert_signal(session: AsyncSession, values: Mapping[str, Any]) -> bool:
    """Record a signal unless its ``(source, event_id)`` was seen; True if recorded."""
    statement = (
        dialect_of(session)
        .insert_or_skip(workflow_signals, ["source", "event_id"], returning=[workflow_signals.c.id])
        .values(**values)
    )
    return (await session.execute(statement)).first() is not None


async def signals(
    session: AsyncSession, tenant: str, workflow_id: str, outcomes: Sequence[str] = ()
) -> list[SignalRecord]:
    """The instance's signals in arrival order, optionally only those with these outcomes."""
    query = (
        select(workflow_signals)
        .where(workflow_signals.c.tenant == tenant, workflow_signals.c.workflow_id == workflow_id)
        .order_by(workflow_signals.c.id)
    )
    if outcomes:
        query = query.where(workflow_signals.c.outcome.in_(list(outcomes)))
    return [SignalRecord.from_row(row) for row in (await session.execute(query)).mappings()]


async def set_signal_outcome(
    session: AsyncSession,
    source: str,
    event_id: str,
    outcome: str,
    *,
    reason: str | None = None,
    consumed_seq: int | None = None,
) -> None:
    """Record what became of a signal."""
    await session.execute(
        update(workflow_signals)
        .where(workflow_signals.c.source == source, workflow_signals.c.event_id == event_id)
        .values(outcome=outcome, reason=reason, consumed_seq=consumed_seq)
    )


async def notify(session: AsyncSession, payload: str) -> None:
    """Wake the workers (PostgreSQL, at commit); nothing on SQLite, whose workers poll."""
    if dialect_of(session).listen_notify:
        await session.execute(
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": NOTIFY_CHANNEL, "payload": payload[:7000]},
        )


class InstanceFilter(TypedDict, total=False):
    """The filters of :func:`list_instances` and :func:`instances_query`."""

    tenant: str | None
    name: str | None
    states: Sequence[str]
    due_before_ms: int | None
    limit: int
    tenants: Collection[str] | None
    before: tuple[int, int] | None
    after: tuple[int, int] | None


async def list_instances(
    session: AsyncSession, **filters: Unpack[InstanceFilter]
) -> list[WorkflowRecord]:
    """Instances filtered by tenant, name and states, most recently changed first; see
    :func:`instances_query`."""
    query = instances_query(**filters)
    return [WorkflowRecord.from_row(row) for row in (await session.execute(query)).mappings()]


def instances_query(
    *,
    tenant: str | None = None,
    name: str | None = None,
    states: Sequence[str] = (),
    due_before_ms: int | None = None,
    limit: int = 100,
    tenants: Collection[str] | None = None,
    before: tuple[int, int] | None = None,
    after: tuple[int, int] | None = None,
) -> Select[Any]:
    """The query of :func:`list_instances`: instances filtered by tenant, name and states, most
    recently changed first (ties: the highest id first); ``tenants``: only those tenants'
    (``None``: any).

    ``before``: the keyset ``(updated_ms, id)`` of the last instance of the previous page; the
    page goes on after it, read backwards along ``ix_workflow_instances_updated``. With
    ``due_before_ms`` (engine clock): only those whose work fell due before then and is not done
    yet (runnable past ``run_at_ms``, or waiting past the wait's deadline), oldest due first
    (ties: the lowest id first): the stuck ones, when it is now minus a threshold. Their pages
    go on ``after`` the keyset ``(due_ms, id)`` of the previous page's last instance
    (:data:`~outboxkit.workflows.tables.DUE_MS`), read along
    ``ix_workflow_instances_due_keyset``; ``before`` is not taken then.
    """
    table = workflow_instances
    query = select(table).limit(limit)
    if due_before_ms is None:
        query = query.order_by(table.c.updated_ms.desc(), table.c.id.desc())
        if before is not None:
            query = query.where(tuple_(table.c.updated_ms, table.c.id) < tuple_(*before))
    else:
        # The status test repeats the index's predicate, so the planner may use it.
        query = query.where(DUE_STATUSES, literal(due_before_ms) >= DUE_MS).order_by(
            DUE_MS, table.c.id
        )
        if after is not None:
            query = query.where(tuple_(DUE_MS, table.c.id) > tuple_(*after))
    if tenant is not None:
        query = query.where(table.c.tenant == tenant)
    if tenants is not None:
        query = query.where(table.c.tenant.in_(sorted(tenants)))
    if name is not None:
        query = query.where(table.c.name == name)
    if states:
        query = query.where(table.c.state.in_(list(states)))
    return query


def due_keyset(record: WorkflowRecord) -> tuple[int, int] | None:
    """The ``(due_ms, id)`` keyset of ``record`` in the stuck filter (``None``: not due)."""
    due = {Status.RUNNABLE: record.run_at_ms, Status.WAITING: record.wait_deadline_ms}.get(
        record.status
    )
    return None if due is None else (due, record.id)


async def count_by_state(session: AsyncSession) -> dict[tuple[str, str], int]:
    """Instances per (name, state)."""
    rows = await session.execute(
        select(workflow_instances.c.name, workflow_instances.c.state, func.count()).group_by(
            workflow_instances.c.name, workflow_instances.c.state
        )
    )
    return {(name, state): count for name, state, count in rows}
