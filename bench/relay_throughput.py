"""Relay throughput against the ceiling: a raw aiokafka idempotent producer, same events.

All publish N CloudEvents of about 1 KB (binary mode, same headers, keys and values) to a
topic of their own on the same broker. The raw producer sends from memory; the polling relay
drains the same events from a PostgreSQL outbox (claim, publish, mark); the logical relay reads
them from a replication slot created before they were written, in transactions of
``--per-transaction`` events (decode, publish, delete, confirm), streamed over the replication
protocol (``logical-stream``) or peeked with SQL (``logical-sql``); ``logical-wal`` streams
the same events written as transactional WAL messages (``Outbox(wal_messages=True)``, no
rows). Usage:

    python -m bench.relay_throughput [--events 50000] [--keys 100] [--per-transaction 10]
        [--sides logical-stream,logical-sql,logical-wal] [--no-freeze]

The relay sides freeze the garbage collector's view of the heap before they start, as the
``outboxkit relay`` CLI does after start-up; ``--no-freeze`` measures a relay embedded in a
process that does not (then the bench's own events in memory are walked too).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
import uuid

from aiokafka import AIOKafkaProducer
from outboxkit.outbox import encode_binary, wal_message
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.writer import outbox_row
from outboxkit.relay import Relay, RelayOptions
from outboxkit.relay.slot import Slot, default_slot_name
from sqlalchemy import text

from bench.common import bulk_fill, kafka, postgres_database, report, sample_events


async def raw_producer(bootstrap: str, topic: str, events: list) -> float:
    """Seconds for an idempotent producer to send and get acks for every event."""
    messages = [encode_binary(e) for e in events]
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        max_batch_size=512 * 1024,
    )
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"warm-up")
        started = time.perf_counter()
        futures = []
        for message in messages:
            headers = [(k, v.encode()) for k, v in message.headers.items()]
            futures.append(
                await producer.send(topic, value=message.payload, key=message.key, headers=headers)
            )
        await asyncio.gather(*futures)
        return time.perf_counter() - started
    finally:
        await producer.stop()


async def relay_drain(
    url: str,
    bootstrap: str,
    topic: str,
    mode: str = "poll",
    reader: str = "stream",
    freeze: bool = True,
) -> tuple[float, int]:
    """Seconds for the relay to drain the outbox, and how many rows it published."""
    warm = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await warm.start()
    await warm.send_and_wait(topic, b"warm-up")
    await warm.stop()
    relay = Relay(
        db_url=url,
        kafka=KafkaSettings(bootstrap=bootstrap),
        options=RelayOptions(
            batch_size=1000,
            retention_s=3600,
            listen=False,
            mode=mode,  # type: ignore[arg-type]
            logical_reader=reader,  # type: ignore[arg-type]
        ),
    )
    if freeze:
        # As `outboxkit relay` does after start-up (cli/relay.py): the garbage collector's full
        # collections no longer walk what is already in memory, here the bench's own events.
        gc.freeze()
    started = time.perf_counter()
    published = await relay.drain(timeout_s=600)
    return time.perf_counter() - started, published


def main() -> None:
    """Run both sides and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--per-transaction", type=int, default=10)
    parser.add_argument(
        "--sides",
        default="logical-stream,logical-sql,logical-wal",
        help="logical sides beside raw and poll, comma-separated",
    )
    parser.add_argument("--no-freeze", action="store_true", help="no gc.freeze() before a relay")
    args = parser.parse_args()
    freeze = not args.no_freeze
    sides = [side for side in args.sides.split(",") if side]
    events = sample_events(args.events, 1000, args.keys)
    logical: dict[str, tuple[float, float]] = {}
    with kafka() as bootstrap, postgres_database() as url:
        topic = f"relay-{uuid.uuid4().hex[:6]}"
        bulk_fill(url, topic, events)
        raw_s = asyncio.run(raw_producer(bootstrap, f"raw-{uuid.uuid4().hex[:6]}", events))
        relay_s, published = asyncio.run(relay_drain(url, bootstrap, topic, freeze=freeze))
        for side in sides:
            with postgres_database() as logical_url:
                logical_topic = f"logical-{uuid.uuid4().hex[:6]}"
                asyncio.run(create_slot(logical_url))
                fill = wal_fill if side == "logical-wal" else bulk_fill
                fill(logical_url, logical_topic, events, per_transaction=args.per_transaction)
                reader = "sql" if side == "logical-sql" else "stream"
                cpu = time.process_time()
                seconds, done = asyncio.run(
                    relay_drain(logical_url, bootstrap, logical_topic, "logical", reader, freeze)
                )
                assert done == args.events, f"{side} published {done} of {args.events}"
                logical[side] = (seconds, time.process_time() - cpu)
    assert published == args.events, f"relay published {published} of {args.events}"
    raw_rate, relay_rate = args.events / raw_s, args.events / relay_s
    ratio = relay_rate / raw_rate
    rows = [
        ["raw aiokafka idempotent producer", raw_s, raw_rate, 1.0, "-"],
        ["relay, poll mode (PostgreSQL)", relay_s, relay_rate, ratio, "-"],
    ]
    extra: dict[str, object] = {}
    for side, (seconds, cpu_s) in logical.items():
        rate = args.events / seconds
        rows.append([f"relay, {side}", seconds, rate, rate / raw_rate, cpu_s])
        key = side.replace("-", "_")
        extra |= {
            f"{key}_seconds": seconds,
            f"{key}_per_s": rate,
            f"{key}_ratio": rate / raw_rate,
            f"{key}_relay_cpu_seconds": cpu_s,
        }
    load = os.getloadavg()
    report(
        "relay_throughput",
        f"{args.events:,} CloudEvents of ~1 KB (load average {load[0]:.1f})",
        ["side", "seconds", "events/s", "ratio to raw", "relay CPU s"],
        rows,
        extra
        | {
            "events": args.events,
            "raw_seconds": raw_s,
            "relay_seconds": relay_s,
            "raw_per_s": raw_rate,
            "relay_per_s": relay_rate,
            "ratio": ratio,
            "target": 0.6,
            "logical_target": 0.8,
            "per_transaction": args.per_transaction,
            "gc_freeze": freeze,
            "load_average": load,
        },
    )
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"ratio relay/raw = {ratio:.2f} (target >= 0.6)")
    for side, (seconds, _) in logical.items():
        print(f"ratio {side}/raw = {args.events / seconds / raw_rate:.2f} (target >= 0.8)")


def wal_fill(url: str, topic: str, events: list, per_transaction: int | None = None) -> None:
    """Write the events as transactional WAL messages (set-up only, not what is measured)."""
    engine = make_engine(url)
    size = per_transaction or len(events) or 1
    for first in range(0, len(events), size):
        with engine.begin() as conn:
            contents = [
                {"content": wal_message.encode(outbox_row(encode_binary(event), topic))}
                for event in events[first : first + size]
            ]
            conn.execute(wal_message.EMIT, contents)
    engine.dispose()


async def create_slot(url: str) -> None:
    """Create the logical relay's slot before the events are written, so it streams them."""
    engine = make_async_engine(url)
    try:
        async with engine.connect() as conn:
            database = str(await conn.scalar(text("SELECT current_database()")))
        await Slot(engine, default_slot_name(database)).ensure()
    finally:
        await engine.dispose()


if __name__ == "__main__":
    main()
