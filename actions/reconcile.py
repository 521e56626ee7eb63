"""Reconciling UNKNOWN operations with the external system, through a user's reconciler.

A reconciler looks the action up by its operation key (sent as the Idempotency-Key) or by a
business reference, and answers :class:`Found` (SUCCEEDED with its result), :class:`Absent`
(proven absent and unable to land any more: PENDING, safe to retry) or :class:`Unclear`
(stays UNKNOWN, flagged ``needs_attention`` for a person). A reconciler that raises counts as
unclear. The reconciler runs outside any transaction; its answer is applied in a short one
that re-checks the operation did not change meanwhile.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from outboxkit.actions.records import OperationRecord, ReconcileOutcome, Unclear
from outboxkit.actions.states import State
from outboxkit.actions.store import ActionStore
from outboxkit.outbox.secrecy import describe_error
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

Reconciler = Callable[[OperationRecord], Awaitable[ReconcileOutcome]]
"""``async def reconciler(operation) -> Found | Absent | Unclear``."""


async def reconcile_one(
    sessions: async_sessionmaker[AsyncSession],
    store: ActionStore,
    reconciler: Reconciler,
    operation: OperationRecord,
    *,
    actor: str = "reconciler",
) -> OperationRecord:
    """Ask ``reconciler`` about one UNKNOWN ``operation`` and record its answer."""
    try:
        outcome = await reconciler(operation)
    except Exception as error:  # the lookup itself failed: we still do not know
        outcome = Unclear(f"reconciler raised {describe_error(error)}")
    async with sessions() as session, session.begin():
        return await store.reconcile(session, operation, outcome, actor=actor)


async def reconcile_unknown(
    sessions: async_sessionmaker[AsyncSession],
    store: ActionStore,
    reconciler: Reconciler,
    *,
    tenant: str | None = None,
    limit: int = 100,
    actor: str = "reconciler",
) -> list[OperationRecord]:
    """Sweep expired leases to UNKNOWN, then reconcile up to ``limit`` UNKNOWN operations.

    Returns the operations as they are afterwards. Run it periodically, or after a restart,
    so that no UNKNOWN operation waits for a person unless the reconciler cannot tell.
    """
    async with sessions() as session, session.begin():
        await store.sweep_expired_leases(session, limit=limit)
    async with sessions() as session:
        unknown = await store.list_operations(
            session, tenant=tenant, state=State.UNKNOWN, limit=limit
        )
    return [
        await reconcile_one(sessions, store, reconciler, operation, actor=actor)
        for operation in unknown
    ]
