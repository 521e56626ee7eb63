"""Helpers shared by the agent-action tests: sessions, outbox rows, audit rows."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from outboxkit.actions import (
    ActionOutcomeUnknownError,
    Actions,
    ActionStore,
    StepOutcome,
    run_action,
)
from outboxkit.actions.tables import agent_operation_audit, agent_operations
from outboxkit.outbox import OutcomeUnknownError
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.tables import outbox_events
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from examples.refund_agent.agent import Refund, Ticket, refund_step
from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import Hold
from tests.support.kafka import wait_for
from tests.support.waits import scaled


@dataclass(frozen=True)
class EventRow:
    """One outbox row of an action event, decoded."""

    type: str
    event_id: str
    key: bytes | None
    data: dict


@asynccontextmanager
async def sessions_for(url: str, pool_size: int = 5) -> AsyncIterator[async_sessionmaker]:
    """An async sessionmaker on a fresh engine, disposed afterwards."""
    kwargs = {"pool_size": pool_size, "max_overflow": 0} if url.startswith("postgresql") else {}
    engine = make_async_engine(url, **kwargs)
    try:
        yield async_sessionmaker(engine, expire_on_commit=False)
    finally:
        await engine.dispose()


async def leave_unknown(url: str, tenant: str, key: str) -> None:
    """One refund action of ``tenant`` whose call lost its reply: UNKNOWN from now on."""

    async def lost_reply(_key: str) -> None:
        raise OutcomeUnknownError("the payment provider did not answer")

    async with sessions_for(url) as sessions:
        with pytest.raises(ActionOutcomeUnknownError):
            await run_action(
                sessions, ActionStore(), lost_reply, tenant=tenant, key=key,
                action_type="refund", params={"cents": 1999}, timeout_s=5,
            )  # fmt: skip


async def begin(sessions: async_sessionmaker, store: ActionStore, **kwargs):
    """One begin in its own committed transaction."""
    async with sessions() as session, session.begin():
        return await store.begin(session, **kwargs)


async def in_tx(sessions: async_sessionmaker, work):
    """Run ``await work(session)`` in its own committed transaction."""
    session: AsyncSession
    async with sessions() as session, session.begin():
        return await work(session)


def events_of(url: str, tenant: str, key: str) -> list[EventRow]:
    """The action events written for ``(tenant, key)``, in write order."""
    prefix = f"{tenant}/{key}/"
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(
                    outbox_events.c.type,
                    outbox_events.c.event_id,
                    outbox_events.c.kafka_key,
                    outbox_events.c.payload,
                )
                .where(outbox_events.c.event_id.startswith(prefix, autoescape=True))
                .order_by(outbox_events.c.id)
            ).all()
    finally:
        engine.dispose()
    return [EventRow(r[0], r[1], r[2], json.loads(r[3])) for r in rows]


def event_types(url: str, tenant: str, key: str) -> list[str]:
    """Just the types of :func:`events_of`, without the common prefix."""
    return [e.type.removeprefix("outboxkit.action.") for e in events_of(url, tenant, key)]


def audit_of(url: str, tenant: str, key: str) -> list[tuple[str | None, str]]:
    """The (from, to) pairs of the audit trail of ``(tenant, key)``."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(agent_operation_audit.c.from_state, agent_operation_audit.c.to_state)
                .where(
                    agent_operation_audit.c.tenant == tenant,
                    agent_operation_audit.c.op_key == key,
                )
                .order_by(agent_operation_audit.c.id)
            ).all()
    finally:
        engine.dispose()
    return [(r[0], r[1]) for r in rows]


def count_operations(url: str) -> int:
    """How many rows ``agent_operations`` holds."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return conn.scalar(select(func.count()).select_from(agent_operations))
    finally:
        engine.dispose()


class RefundSteps:
    """The example's refund step under one agent run, called the way the tests need it."""

    def __init__(self, sessions, store: ActionStore, provider_url: str, **options) -> None:
        tenant = options.pop("tenant", "acme")
        self.payments = PaymentsClient(provider_url, account=tenant, timeout_s=30)
        self.step = refund_step(self.payments)
        self.actions = Actions(
            sessions, store=store, tenant=tenant, run_id=options.pop("run_id", "run-1"), **options
        )

    def key(self, ticket: Ticket) -> str:
        """The operation key of ``ticket``'s refund in this run."""
        with self.actions:
            return self.step.key(ticket.charge_id, ticket.amount_cents, ticket.currency)

    async def __call__(self, ticket: Ticket) -> StepOutcome[Refund]:
        """Refund ``ticket`` (or return the stored refund), with the operation."""
        with self.actions:
            return await self.step.outcome(ticket.charge_id, ticket.amount_cents, ticket.currency)


async def kill_once_the_provider_committed(
    worker: subprocess.Popen[bytes], hold: Hold, what: str
) -> None:
    """SIGKILL ``worker`` as soon as the provider holds its committed refund (``hold``), as a
    crash after the side effect and before the record would; then let the provider go on."""
    try:
        await wait_for(lambda: hold.reached.is_set() or worker.poll() is not None, bool, 300, what)
        assert worker.poll() is None, worker.stdout.read().decode() if worker.stdout else ""
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(scaled(30)) == -signal.SIGKILL
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(scaled(30))
        if worker.stdout is not None:
            worker.stdout.close()
        hold.release()
