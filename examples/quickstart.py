"""Quick start: the whole pipeline on a SQLite file and a local Apache Kafka broker.

1. migrate a fresh SQLite database;
2. start a real single-node Kafka broker (or use ``OUTBOXKIT_KAFKA_BOOTSTRAP``);
3. place orders: each transaction writes the order row and its CloudEvent, one is rolled back;
4. run the relay until the outbox is drained;
5. read the records back from Kafka;
6. consume them with an inbox-deduplicated handler that writes one invoice per order, then
   deliver one record a second time and show that the inbox absorbs it.

Run it with ``python -m examples.quickstart``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from outboxkit.consumers import ConsumerApp, ConsumerRuntime
from outboxkit.migrations.runner import upgrade
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.logs import configure_logging
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay import Relay, RelayOptions
from outboxkit.testing.kafka import broker_from_env
from pydantic import BaseModel
from sqlalchemy import Column, Integer, MetaData, Numeric, String, Table, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

WORKDIR = Path(".outboxkit/quickstart")
# A topic of its own per run, so a broker shared with earlier runs shows only this run's records.
TOPIC = f"shop.orders.{uuid.uuid4().hex[:6]}"

shop = MetaData()
orders = Table(
    "orders",
    shop,
    Column("id", Integer, primary_key=True),
    Column("customer", String(50), nullable=False),
    Column("total", Numeric(10, 2), nullable=False),
)


invoices = Table(
    "invoices",
    shop,
    Column("order_id", Integer, primary_key=False, nullable=False),
    Column("amount", Numeric(10, 2), nullable=False),
)


class OrderPlaced(BaseModel):
    """The event's data."""

    order_id: int
    customer: str
    total: str


billing = ConsumerApp(name="billing", retention_interval_s=None)


@billing.handler("shop.order.placed", topic=TOPIC)
async def invoice_order(order: OrderPlaced, session: AsyncSession) -> None:
    """The effect: one invoice row per order (no unique key: a second apply would show)."""
    await session.execute(invoices.insert().values(order_id=order.order_id, amount=order.total))


def kafka():
    """A local broker, unless OUTBOXKIT_KAFKA_BOOTSTRAP names one."""
    print("Kafka: OUTBOXKIT_KAFKA_BOOTSTRAP, else a local Apache Kafka broker (KRaft, 127.0.0.1)")
    return broker_from_env(on_start=lambda bootstrap: print(f"ready: {bootstrap}"))


def place_orders(db_url: str) -> None:
    """Each order and its event commit together; the failing one leaves neither."""
    engine = make_engine(db_url)
    shop.create_all(engine)
    outbox = Outbox(topics={"shop.order.placed": TOPIC})
    placed = [(1, "ada", "12.50"), (2, "grace", "99.00"), (3, "ada", "7.25")]
    for order_id, customer, total in placed:
        with Session(engine) as session, session.begin():
            session.execute(orders.insert().values(id=order_id, customer=customer, total=total))
            data = OrderPlaced(order_id=order_id, customer=customer, total=total)
            event = new_event("shop.order.placed", "/shop", data, partitionkey=customer)
            outbox.add(session, event)
    try:
        with Session(engine) as session, session.begin():
            session.execute(orders.insert().values(id=4, customer="eve", total="-1"))
            data = OrderPlaced(order_id=4, customer="eve", total="-1")
            outbox.add(session, new_event("shop.order.placed", "/shop", data))
            raise ValueError("a negative total is refused: the transaction rolls back")
    except ValueError as error:
        print(f"order 4 rolled back ({error}): no row, no event")
    engine.dispose()
    order_count, pending = count_rows(db_url, orders), count_rows(db_url, outbox_events)
    print(f"orders in the database: {order_count}; events waiting in the outbox: {pending}")


async def show_topic(bootstrap: str, expected: int) -> list:
    """Print the records the relay published; return them."""
    consumer = AIOKafkaConsumer(
        TOPIC, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    try:
        seen: list = []
        while len(seen) < expected:
            batch = await consumer.getmany(timeout_ms=5000)
            if not batch:
                break
            for record in (r for records in batch.values() for r in records):
                seen.append(record)
                headers = {k: v.decode() for k, v in record.headers}
                print(
                    f"  kafka {record.topic}[{record.partition}]@{record.offset} "
                    f"key={record.key.decode()} type={headers['ce_type']} id={headers['ce_id']} "
                    f"data={json.loads(record.value)}"
                )
    finally:
        await consumer.stop()
    return seen


async def consume(db_url: str, bootstrap: str, records: list) -> None:
    """Run the billing consumer until every order is invoiced, then redeliver one record."""
    runtime = ConsumerRuntime(billing, kafka=KafkaSettings(bootstrap=bootstrap), db_url=db_url)
    running = asyncio.create_task(runtime.run())
    try:

        async def invoiced() -> tuple[int, int]:
            return await count_rows_async(db_url, invoices), runtime.stats.applied

        # the stats count an event once its transaction committed: both, not just the rows
        await _until(invoiced, (len(records), len(records)).__eq__, runtime, running)
        print(
            f"billing consumer applied {runtime.stats.applied} events: "
            f"{await count_rows_async(db_url, invoices)} invoices"
        )
        duplicate = records[0]
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(
                duplicate.topic, duplicate.value, key=duplicate.key, headers=list(duplicate.headers)
            )
        finally:
            await producer.stop()
        await _until(_stat(runtime, "duplicates"), (1).__eq__, runtime, running)
        print(
            f"the first record delivered again: skipped by the inbox "
            f"(duplicates={runtime.stats.duplicates}); invoices still "
            f"{await count_rows_async(db_url, invoices)}"
        )
    finally:
        await runtime.stop()
        await running


def _stat(runtime: ConsumerRuntime, name: str):
    async def read() -> int:
        return getattr(runtime.stats, name)

    return read


async def _until(probe, done, runtime: ConsumerRuntime, running: asyncio.Task) -> None:
    # Generous for a loaded machine; the consumer usually gets there within a second or two.
    deadline = time.monotonic() + 180
    while not done(await probe()):
        if running.done():
            running.result()
            raise RuntimeError("the consumer stopped early")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the consumer did not get there in 180 s: {runtime.stats}")
        await asyncio.sleep(0.1)


async def count_rows_async(db_url: str, table: Table) -> int:
    """Rows in ``table``, read in a thread: a blocking read in the event loop would wait on
    SQLite's lock while the consumer holding it, on the same loop, cannot finish."""
    return await asyncio.to_thread(count_rows, db_url, table)


def count_rows(db_url: str, table: Table) -> int:
    """Rows in ``table``."""
    engine = make_engine(db_url)
    with engine.connect() as conn:
        count = conn.scalar(select(func.count()).select_from(table))
    engine.dispose()
    return count


def main() -> None:
    """Run the quick start from a fresh working folder."""
    configure_logging("WARNING")
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir(parents=True)
    db_url = f"sqlite:///{WORKDIR / 'shop.db'}"
    upgrade(db_url)
    print(f"migrated {db_url}")
    place_orders(db_url)
    with kafka() as bootstrap:
        relay = Relay(
            db_url=db_url,
            kafka=KafkaSettings(bootstrap=bootstrap),
            options=RelayOptions(poll_interval_s=0.2),
        )
        published = asyncio.run(relay.drain(timeout_s=120))
        print(f"relay published {published} events; records on Kafka topic {TOPIC!r}:")
        records = asyncio.run(show_topic(bootstrap, published))
        asyncio.run(consume(db_url, bootstrap, records))


if __name__ == "__main__":
    main()
