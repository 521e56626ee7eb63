"""Writing a step's decision: one transaction that re-reads the claimed row under its lock.

If the lease was lost or an operator acted meanwhile, the decision is dropped (the effects were
keyed, so whoever runs the state next gets their stored results); if a cancel was asked
meanwhile, the cancel wins. Signals are settled in the same transaction.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from outboxkit.workflows import matching, store
from outboxkit.workflows.changes import write
from outboxkit.workflows.decisions import Decision, Retry, adopt_cancel
from outboxkit.workflows.metrics import TRANSITIONS
from outboxkit.workflows.records import Status, WorkflowRecord

if TYPE_CHECKING:
    from outboxkit.workflows.engine import WorkflowEngine

log = logging.getLogger("outboxkit.workflows")


async def commit(
    engine: WorkflowEngine, claimed: WorkflowRecord, holder: str, decision: Decision, now: int
) -> None:
    """Write ``decision`` for the instance ``holder`` claimed, unless it was overtaken."""
    async with engine.sessions() as session, session.begin():
        current = await store.get(session, claimed.tenant, claimed.workflow_id, lock=True)
        if current is None or current.lease_holder != holder or current.seq != claimed.seq:
            log.info(
                "workflow %s: lease lost or changed meanwhile; its step is dropped",
                claimed.workflow_id,
            )
            return
        if decision is None:
            await store.release(session, current.id, holder)
            return
        if isinstance(decision, Retry):
            await store.update_instance(
                session,
                current.id,
                {
                    "status": Status.RUNNABLE.value,
                    "run_at_ms": decision.run_at_ms,
                    "attempts": decision.attempts,
                    "first_failure_ms": decision.first_failure_ms,
                    "failure_class": decision.failure_class,
                    "last_error": decision.last_error,
                    "open_unknown": decision.open_unknown,
                    "lease_holder": None,
                    "lease_expires_ms": None,
                    "updated_ms": now,
                },
            )
            return
        if current.cancel_requested_ms is not None and claimed.cancel_requested_ms is None:
            decision = adopt_cancel(current, decision, now)
        written = await write(session, engine.sink, current, decision, now)
        TRANSITIONS.labels(current.name, decision.kind).inc()
        if decision.kind == "resume":
            await settle_signals(session, claimed, written)
        if decision.wait is not None:
            await match_pending(session, written, now)


async def settle_signals(session: Any, claimed: WorkflowRecord, written: WorkflowRecord) -> None:
    """The signal that resumed the wait is consumed; others accepted for it came late."""
    wait = claimed.wait
    assert wait is not None
    first = True
    for signal in await store.signals(
        session, claimed.tenant, claimed.workflow_id, [matching.ACCEPTED]
    ):
        if signal.correlation != wait.correlation:
            continue
        if first:
            await store.set_signal_outcome(
                session,
                signal.source,
                signal.event_id,
                matching.CONSUMED,
                consumed_seq=written.seq,
            )
            first = False
        else:
            await store.set_signal_outcome(
                session,
                signal.source,
                signal.event_id,
                matching.LATE,
                reason="another signal resumed the wait first",
            )


async def match_pending(session: Any, written: WorkflowRecord, now: int) -> None:
    """Signals that arrived before the wait began are judged against it now."""
    wait = written.wait
    assert wait is not None
    accepted = False
    for signal in await store.signals(
        session, written.tenant, written.workflow_id, [matching.PENDING]
    ):
        outcome, reason = matching.judge(wait, signal)
        if outcome == matching.PENDING:
            continue
        await store.set_signal_outcome(
            session, signal.source, signal.event_id, outcome, reason=reason
        )
        accepted = accepted or outcome == matching.ACCEPTED
    if accepted:
        await store.update_instance(
            session, written.id, {"status": Status.RUNNABLE.value, "run_at_ms": now}
        )
        await store.notify(session, written.workflow_id)
