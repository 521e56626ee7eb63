"""Quick start: the whole pipeline on a SQLite file and a local Apache Kafka broker.

1. migrate a fresh SQLite database;
2. start a real single-node Kafka broker (or use ``OUTBOXKIT_KAFKA_BOOTSTRAP``);
3. place orders: each transaction writes the order row and its CloudEvent, one is rolled back;
4. run the relay until the outbox is drained;
5. read the records back from Kafka.

Run it with ``python -m examples.quickstart``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from pydantic import BaseModel
from sqlalchemy import Column, Integer, MetaData, Numeric, String, Table, func, select
from sqlalchemy.orm import Session

from outbox import Outbox, new_event
from outbox.db import make_engine
from outbox.dev.kafka import KafkaBroker
from outbox.logs import configure_logging
from outbox.migrate import upgrade
from outbox.tables import outbox_events
from relay import Relay, RelayOptions

WORKDIR = Path(".outboxkit/quickstart")
TOPIC = "shop.orders"

shop = MetaData()
orders = Table(
    "orders",
    shop,
    Column("id", Integer, primary_key=True),
    Column("customer", String(50), nullable=False),
    Column("total", Numeric(10, 2), nullable=False),
)


class OrderPlaced(BaseModel):
    """The event's data."""

    order_id: int
    customer: str
    total: str


@contextmanager
def kafka():
    """A local broker, unless OUTBOXKIT_KAFKA_BOOTSTRAP names one."""
    given = os.environ.get("OUTBOXKIT_KAFKA_BOOTSTRAP")
    if given:
        yield given
        return
    print("starting a local Apache Kafka broker (KRaft, 127.0.0.1) ...")
    broker = KafkaBroker()
    broker.start()
    print(f"ready: {broker.bootstrap}")
    try:
        yield broker.bootstrap
    finally:
        broker.close()


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
    with engine.connect() as conn:
        order_count = conn.scalar(select(func.count()).select_from(orders))
        pending = conn.scalar(select(func.count()).select_from(outbox_events))
    engine.dispose()
    print(f"orders in the database: {order_count}; events waiting in the outbox: {pending}")


async def show_topic(bootstrap: str, expected: int) -> None:
    """Print the records the relay published."""
    consumer = AIOKafkaConsumer(
        TOPIC, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    try:
        seen = 0
        while seen < expected:
            batch = await consumer.getmany(timeout_ms=5000)
            if not batch:
                break
            for record in (r for records in batch.values() for r in records):
                seen += 1
                headers = {k: v.decode() for k, v in record.headers}
                print(
                    f"  kafka {record.topic}[{record.partition}]@{record.offset} "
                    f"key={record.key.decode()} type={headers['ce_type']} id={headers['ce_id']} "
                    f"data={json.loads(record.value)}"
                )
    finally:
        await consumer.stop()


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
        relay = Relay(db_url, bootstrap, RelayOptions(poll_interval_s=0.2))
        published = asyncio.run(relay.drain(timeout=120))
        print(f"relay published {published} events; records on Kafka topic {TOPIC!r}:")
        asyncio.run(show_topic(bootstrap, published))


if __name__ == "__main__":
    main()
