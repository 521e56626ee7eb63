"""A logical relay's first start on a full table: every row published from the table, counted.

Writes N rows (about 150 bytes of payload and headers each, 50 keys) with a few big INSERTs,
then drains a logical relay at its default settings (``RelayOptions(mode="logical")``: 30 s
leases, batches of 500): it creates the slot and catches up from the table
(relay/catch_up.py). Reports the time from the relay's start to the end of its drain, the
records on the topic (summed end offsets) and the rows left in the table. Usage:

    python -m bench.logical_catch_up [--rows 1000000]

Before issue 22 the catch-up stopped once its 30 s leases expired and left the rest in the
table (404,000 of 800,000 rows on a quiet machine).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay import Relay, RelayOptions
from sqlalchemy import func, select, text

from bench.common import kafka, postgres_database, report

FILL = """
INSERT INTO outbox_events (source, event_id, type, topic, kafka_key, shard, headers, payload,
  created_ms, available_ms, attempts)
SELECT '/bench', 'e-' || g, 'bench', :topic, convert_to('key-' || (g % 50), 'UTF8'), g % 64,
  '{"ce_id": "e-' || g || '", "ce_source": "/bench", "ce_type": "bench", '
  || '"ce_specversion": "1.0", "content-type": "application/json"}',
  convert_to('{"seq": ' || g || '}', 'UTF8'), now_ms, now_ms, 0
FROM generate_series(CAST(:start AS bigint), CAST(:stop AS bigint) - 1) AS g,
  (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms) AS clock
"""


def fill(url: str, topic: str, rows: int, per_insert: int = 100_000) -> None:
    engine = make_engine(url)
    for start in range(0, rows, per_insert):
        with engine.begin() as conn:
            stop = min(start + per_insert, rows)
            conn.execute(text(FILL), {"topic": topic, "start": start, "stop": stop})
    engine.dispose()


def left_in_table(url: str) -> int:
    engine = make_engine(url)
    with engine.connect() as conn:
        count = int(conn.scalar(select(func.count()).select_from(outbox_events)) or 0)
    engine.dispose()
    return count


async def records_on(bootstrap: str, topic: str) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        metadata = await producer.client.fetch_all_metadata()
    finally:
        await producer.stop()
    partitions = metadata.partitions_for_topic(topic) or set()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
        return sum(ends.values())
    finally:
        await consumer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    topic = f"bench-catch-up-{uuid.uuid4().hex[:8]}"
    with kafka() as bootstrap, postgres_database() as url:
        began = time.monotonic()
        fill(url, topic, args.rows)
        filled_s = time.monotonic() - began
        print(f"{args.rows} rows written in {filled_s:.1f} s; draining a logical relay")
        relay = Relay(
            db_url=url,
            kafka=KafkaSettings(bootstrap=bootstrap),
            options=RelayOptions(mode="logical"),
        )
        began = time.monotonic()
        published = asyncio.run(relay.drain(timeout_s=None))
        drained_s = time.monotonic() - began
        on_kafka = asyncio.run(records_on(bootstrap, topic))
        left = left_in_table(url)
    row = [args.rows, published, on_kafka, left, drained_s, published / drained_s]
    report(
        "logical_catch_up",
        "Logical relay: first start on a full table (default settings)",
        ["rows", "published", "on Kafka", "left in table", "seconds", "rows/s"],
        [row],
        {
            "rows": args.rows,
            "published": published,
            "on_kafka": on_kafka,
            "left_in_table": left,
            "seconds": drained_s,
        },
    )


if __name__ == "__main__":
    main()
