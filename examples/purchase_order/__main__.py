"""``python -m examples.purchase_order``: PO-2026-481 from request to issue, told step by step.

The supplier's ERP and the notifier run on loopback HTTP; the workflow runs on the database of
``--db-url`` (a SQLite file by default). Days pass on a business clock shared by the engine
and the supplier. Signals are handed to the engine the way its consumer does it
(``engine.deliver`` in the inbox's transaction); ``engine.consumer_app()`` takes them from
Kafka in production (see ``tests/examples/test_purchase_order.py`` for that run).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from outboxkit.migrations.runner import upgrade
from outboxkit.outbox import Outbox
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.settings import Settings
from outboxkit.workflows import HmacVerifier, WorkflowEngine, request_hash
from outboxkit.workflows.events import reminder_timer
from sqlalchemy.ext.asyncio import async_sessionmaker

from examples.purchase_order.approvals import approval_event
from examples.purchase_order.clock import BusinessClock
from examples.purchase_order.definition import (
    APPROVALS,
    DAY_S,
    NAME,
    Services,
    definitions,
    issue_key,
)
from examples.purchase_order.notifier import NotifierClient, NotifierService
from examples.purchase_order.sample import PO_2026_481, TENANT
from examples.purchase_order.supplier import Fault, SupplierService
from examples.purchase_order.supplier_client import SupplierClient

APPROVER_KEY = b"demo-approvals-key"
PO = PO_2026_481["po"]


class Demo:
    """The engine, its services and the clock, with the few moves the story makes."""

    def __init__(
        self,
        engine: WorkflowEngine,
        sessions: async_sessionmaker[Any],
        supplier: SupplierService,
        notifier: NotifierService,
        clock: BusinessClock,
    ) -> None:
        self.engine = engine
        self.sessions = sessions
        self.supplier = supplier
        self.notifier = notifier
        self.clock = clock
        self.shown = 0

    async def work(self) -> None:
        """What a worker does: run every step due now; print the new history records."""
        while await self.engine.run_due():
            pass
        async with self.sessions() as session:
            history = await self.engine.history(session, TENANT, PO)
        for record in history[self.shown :]:
            keys = [step["key"] for step in record.steps]
            extra = f"  effects {keys}" if keys else ""
            print(
                f"   #{record.seq} {record.kind}: {record.from_state} -> {record.to_state}{extra}"
            )
        self.shown = len(history)

    async def deliver(self, event: Any) -> str:
        """What the engine's consumer does with an event from the signals topic."""
        async with self.sessions() as session, session.begin():
            signal = await self.engine.deliver(session, event)
        if signal is None:
            return "a duplicate: ignored"
        return signal.outcome + (f" ({signal.reason})" if signal.reason else "")

    async def state(self) -> Any:
        """The instance as stored."""
        async with self.sessions() as session:
            return await self.engine.get(session, TENANT, PO)

    async def preview(self) -> dict[str, Any]:
        """The preview of the open approval wait, from its history record."""
        async with self.sessions() as session:
            history = await self.engine.history(session, TENANT, PO)
        wait = [record for record in history if record.kind == "wait"][-1]
        preview: dict[str, Any] = wait.decision["decision"]["preview"]
        return preview

    async def approval(self, preview: dict[str, Any], event_id: str) -> Any:
        """The CFO's signed approval of ``preview`` for the open wait."""
        record = await self.state()
        return approval_event(
            APPROVER_KEY,
            tenant=TENANT,
            workflow_id=PO,
            correlation=record.wait.correlation,
            preview=preview,
            by="cfo@acme.example",
            event_id=event_id,
        )


async def demo(db_url: str) -> int:
    """Tell the story; exit 0 if it ends with one order and one notification."""
    upgrade(db_url)
    engine = make_async_engine(db_url)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    clock = BusinessClock()
    try:
        with (
            SupplierService(clock=clock) as supplier,
            NotifierService() as notifier,
        ):
            services = Services(SupplierClient(supplier.url), NotifierClient(notifier.url))
            workflows = WorkflowEngine(
                definitions(services),
                sessions=sessions,
                outbox=Outbox(),
                verifier=HmacVerifier({APPROVALS: APPROVER_KEY}),
                clock=clock,
            )
            return await story(Demo(workflows, sessions, supplier, notifier, clock))
    finally:
        await engine.dispose()


async def story(po: Demo) -> int:
    """The steps of the demo, printed as they happen."""
    print(f"1. {PO} is requested by {TENANT}: validated, quoted, then it waits for approval")
    async with po.sessions() as session, session.begin():
        await po.engine.start(session, NAME, PO, PO_2026_481, tenant=TENANT, owner="maria")
    await po.work()
    preview = await po.preview()
    print(
        f"   preview: {preview['supplier']}, {preview['cost_centre']}, "
        f"{preview['total_cents'] / 100:.2f} {preview['currency']}, quote {preview['quote_id']}"
    )
    print(f"   the approval must carry its hash {request_hash(preview)[:16]}...")

    print("2. an approval of another preview (a lower total) is refused; the wait goes on")
    other = {**preview, "total_cents": preview["total_cents"] - 10_000}
    print(f"   {await po.deliver(await po.approval(other, 'approval-forged'))}")

    print("3. two days pass: the reminder timers come due and are published")
    record = await po.state()
    for day in (1, 2):
        po.clock.advance(DAY_S)
        sink = po.engine.sink
        timer = reminder_timer(sink.source, sink.signals_topic, TENANT, PO, record.wait, day)
        assert timer is not None
        reminder = timer[0]
        print(f"   day {day}: {await po.deliver(reminder)}")
    await po.work()

    print("4. the CFO approves; the event is delivered twice")
    approval = await po.approval(preview, "approval-cfo-1")
    print(f"   first:  {await po.deliver(approval)}")
    print(f"   second: {await po.deliver(approval)}")

    print("5. the supplier commits the order, then its gateway times out (504)")
    po.supplier.inject(Fault.GATEWAY_TIMEOUT_AFTER_COMMIT)
    await po.work()
    record = await po.state()
    print(f"   {record.state}: {record.failure_class}, open unknown {record.open_unknown}")

    print("6. the next run looks the order up by its key before anything else")
    po.notifier.fail_next(2)
    print("   (and the notifier will fail twice: the notification is retried on its own)")
    po.clock.advance(60)
    calls = len(po.supplier.requests)
    await po.work()
    print(f"   supplier calls since the timeout: {po.supplier.requests[calls:]}")

    record = await po.state()
    async with po.sessions() as session:
        last = (await po.engine.history(session, TENANT, PO))[-1]
    orders = po.supplier.orders()
    sent = po.notifier.sent()
    print(f"final state: {record.state}, result {last.result}")
    print(f"orders at the supplier: {len(orders)} (key {issue_key(PO)})")
    print(f"order POSTs the supplier received: {po.supplier.requests.count('POST /orders')}")
    print(f"notifications sent: {len(sent)} after {po.notifier.attempts} attempts")
    ok = record.state == "complete" and len(orders) == 1 and len(sent) == 1
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run the demo."""
    parser = argparse.ArgumentParser(prog="python -m examples.purchase_order")
    parser.add_argument("--db-url", default=Settings().db_url, help="[env: OUTBOXKIT_DB_URL]")
    args = parser.parse_args(argv)
    return asyncio.run(demo(args.db_url))


if __name__ == "__main__":
    raise SystemExit(main())
