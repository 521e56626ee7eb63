"""The purchase order example wired for tests: its services, an engine on a movable clock.

:func:`purchase_orders` starts the supplier's ERP and the notifier on loopback HTTP and builds
an engine with both versions of the workflow; :class:`Harness` drives it the way a worker and
an approver would, and reads back what the tests count (orders, notifications, history rows,
signals, outbox rows).
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers.decoding import decode_record
from outboxkit.outbox import Outbox
from outboxkit.outbox.tables import outbox_events
from outboxkit.workflows import (
    HistoryRecord,
    HmacVerifier,
    SignalRecord,
    WorkflowEngine,
    WorkflowRecord,
)
from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from examples.purchase_order.approvals import approval_event
from examples.purchase_order.clock import BusinessClock
from examples.purchase_order.definition import APPROVALS, NAME, Services, definitions
from examples.purchase_order.notifier import NotifierClient, NotifierService
from examples.purchase_order.sample import PO_2026_481, TENANT
from examples.purchase_order.supplier import SupplierService
from examples.purchase_order.supplier_client import SupplierClient
from tests.support.actions import sessions_for

APPROVER_KEY = b"approvals-hmac-key-for-tests"
PO = PO_2026_481["po"]


@dataclass
class Harness:
    """One engine on the example's workflow, its services, and the business clock."""

    engine: WorkflowEngine
    sessions: async_sessionmaker
    supplier: SupplierService
    notifier: NotifierService
    clock: Any
    """The business clock (a :class:`BusinessClock` unless the test gave another)."""
    events_topic: str
    signals_topic: str
    services: Services

    def use_versions(self, *versions: int) -> None:
        """Replace the engine by one running only these versions of the workflow (a deploy)."""
        self.engine = build_engine(self, versions)

    async def start(self, request: dict[str, Any] | None = None, workflow_id: str = PO) -> None:
        """Start ``workflow_id`` on ``request`` (PO-2026-481 by default) in its own transaction."""
        async with self.sessions() as session, session.begin():
            await self.engine.start(
                session, NAME, workflow_id, request or PO_2026_481, tenant=TENANT, owner="maria"
            )

    async def tick(self, limit: int = 50) -> int:
        """Run the worker's steps until none is due now; returns how many ran."""
        steps = 0
        while await self.engine.run_due():
            steps += 1
            assert steps < limit, "the workflow keeps stepping"
        return steps

    async def get(self, workflow_id: str = PO) -> WorkflowRecord:
        """The instance as stored."""
        async with self.sessions() as session:
            record = await self.engine.get(session, TENANT, workflow_id)
        assert record is not None
        return record

    async def history(self, workflow_id: str = PO) -> list[HistoryRecord]:
        """Its history, oldest first."""
        async with self.sessions() as session:
            return await self.engine.history(session, TENANT, workflow_id)

    async def signals(self, workflow_id: str = PO) -> list[SignalRecord]:
        """The signals addressed to it, in arrival order."""
        async with self.sessions() as session:
            return await self.engine.signals(session, TENANT, workflow_id)

    async def preview(self, workflow_id: str = PO) -> dict[str, Any]:
        """The preview of the open approval wait, as its history record shows it."""
        waits = [h for h in await self.history(workflow_id) if h.kind == "wait"]
        return copy.deepcopy(waits[-1].decision["decision"]["preview"])

    async def approval(
        self,
        *,
        preview: dict[str, Any] | None = None,
        granted: bool = True,
        key: bytes = APPROVER_KEY,
        event_id: str | None = None,
        workflow_id: str = PO,
    ) -> CloudEvent:
        """A signed approval of the open wait (of ``preview``: by default the one shown)."""
        record = await self.get(workflow_id)
        assert record.wait is not None, f"{workflow_id} is not waiting ({record.state})"
        return approval_event(
            key,
            tenant=TENANT,
            workflow_id=workflow_id,
            correlation=record.wait.correlation,
            preview=preview if preview is not None else await self.preview(workflow_id),
            by="cfo@acme.example",
            event_id=event_id or f"approval-{uuid.uuid4().hex[:8]}",
            granted=granted,
        )

    async def deliver(self, event: CloudEvent) -> SignalRecord | None:
        """Hand ``event`` to the engine as its consumer would (in one transaction)."""
        async with self.sessions() as session, session.begin():
            return await self.engine.deliver(session, event)

    async def approve(self, **options: Any) -> SignalRecord | None:
        """Deliver a signed approval of the open wait, then run the worker's steps."""
        signal = await self.deliver(await self.approval(**options))
        await self.tick()
        return signal

    async def outbox_rows(self, event_type: str) -> list[dict[str, Any]]:
        """The outbox rows of ``event_type``, oldest first (``deliver_at_ms`` included)."""
        async with self.sessions() as session:
            rows = await session.execute(
                select(outbox_events)
                .where(outbox_events.c.type == event_type)
                .order_by(outbox_events.c.id)
            )
            return [dict(row) for row in rows.mappings()]


def decode_row(row: dict[str, Any]) -> CloudEvent:
    """The event an outbox row holds, as a consumer reads it from Kafka."""
    headers = [(name, value.encode()) for name, value in json.loads(row["headers"]).items()]
    return decode_record(headers, row["payload"])


@asynccontextmanager
async def purchase_orders(
    db_url: str,
    *,
    clock: Callable[[], float] | None = None,
    quote_ttl_s: float = 7 * 24 * 3600.0,
    events_topic: str = "po.workflow-events",
    signals_topic: str = "po.workflow-signals",
) -> AsyncIterator[Harness]:
    """The example's services and an engine on ``db_url``; everything closed afterwards."""
    clock = clock or BusinessClock()
    with (
        SupplierService(clock=clock, quote_ttl_s=quote_ttl_s) as supplier,
        NotifierService() as notifier,
    ):
        async with sessions_for(db_url) as sessions:
            services = Services(SupplierClient(supplier.url), NotifierClient(notifier.url))
            harness = Harness(
                None,  # type: ignore[arg-type]  # built next
                sessions,
                supplier,
                notifier,
                clock,
                events_topic,
                signals_topic,
                services,
            )
            harness.use_versions(1, 2)
            yield harness


def build_engine(harness: Harness, versions: tuple[int, ...]) -> WorkflowEngine:
    """An engine on the harness's database, services and clock, with these versions."""
    return WorkflowEngine(
        [wf for wf in definitions(harness.services) if wf.version in versions],
        sessions=harness.sessions,
        outbox=Outbox(),
        events_topic=harness.events_topic,
        signals_topic=harness.signals_topic,
        verifier=HmacVerifier({APPROVALS: APPROVER_KEY}),
        clock=harness.clock,
    )
