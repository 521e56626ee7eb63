"""Consumer runtime throughput against a baseline: raw aiokafka plus batched effect inserts.

N CloudEvents of about 1 KB (binary mode, as the relay publishes them) are produced once to a
topic of several partitions. Each side then reads all of them with a consumer group of its own
and writes one ``bench_effects`` row per event into a fresh PostgreSQL database of its own on the
same server:

- baseline: an ``AIOKafkaConsumer`` reading batches, taking source/id from the ``ce_`` headers
  and ``seq`` from the JSON value, inserting the batch's rows in one plain transaction
  (executemany), then committing the offsets by hand. No inbox, no CloudEvent decoding, no
  pydantic, no per-record error handling;
- runtime: a :class:`consumers.ConsumerRuntime` with inbox dedupe, in this process, whose batch
  handler (``bench.consumer_app``) inserts a chunk's rows with one executemany statement. Its
  garbage collector is set up as ``outboxkit consume`` sets it up (``--gc-defaults``: left at
  Python's defaults, as in a host process that embeds the runtime);
- runtime in sequence mode: the same with ``on_dead_letter="sequence"`` and no poison record,
  so what is measured is the blocked-key check on the hot path (target >= 0.95 of the above);
- runtime, one INSERT per event: the same with a per-event handler executing one statement;
- runtime without SQL (``--no-ceiling`` leaves it out): the same, but the handler executes no
  statement, so only the runtime's own work is left (decoding, pydantic, one inbox claim
  statement per chunk, commits). It bounds what any handler with one statement per event can
  reach; it writes no effects, so its inbox rows are counted instead.

Each side's clock starts when its first records are in hand (group join and broker start-up are
not measured) and stops when all N effects are committed. Usage:

    python -m bench.consumer_throughput [--events 50000] [--partitions 3] [--repeat 2]
        [--sides baseline,runtime,sequence,each,ceiling] [--gc-defaults]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import time
import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from outboxkit.consumers import ConsumerRuntime, inbox_events
from outboxkit.outbox import encode_binary
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.testing.kafka import create_topic
from sqlalchemy import func, insert, select

from bench.common import (
    gc_as_in_outboxkit_consume,
    kafka,
    postgres_database,
    report,
    sample_events,
)
from bench.consumer_app import Effect, bench_effects, create_effects_table, make_app

BATCH = 500  # max_poll_records of both sides (the runtime's default max_batch)
TARGET = 0.8  # runtime with a batch handler / baseline
SEQUENCE_TARGET = 0.95  # on_dead_letter="sequence" / the default, without poison records


async def produce(bootstrap: str, topic: str, events: list) -> None:
    """Publish ``events`` in binary mode and wait for every acknowledgement."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        linger_ms=5,
        max_batch_size=512 * 1024,
    )
    await producer.start()
    try:
        futures = []
        for event in events:
            encoded = encode_binary(event)
            headers = [(k, v.encode()) for k, v in encoded.headers.items()]
            futures.append(
                await producer.send(topic, encoded.payload, key=encoded.key, headers=headers)
            )
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def count_rows(url: str, table: Any) -> int:
    """Rows in ``table``."""
    engine = make_async_engine(url)
    try:
        async with engine.connect() as connection:
            return int(await connection.scalar(select(func.count()).select_from(table)))
    finally:
        await engine.dispose()


async def baseline(bootstrap: str, topic: str, url: str, expected: int) -> float:
    """Seconds for raw consumption plus batched effect inserts and manual offset commits."""
    engine = make_async_engine(url)
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"baseline-{uuid.uuid4().hex[:6]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=BATCH,
    )
    statement = insert(bench_effects)
    await consumer.start()
    done, started = 0, 0.0
    try:
        while done < expected:
            batch = await consumer.getmany(timeout_ms=500)
            if not batch:
                continue
            started = started or time.perf_counter()
            for tp, records in batch.items():
                rows: list[dict[str, Any]] = []
                for record in records:
                    headers = dict(record.headers)
                    rows.append(
                        {
                            "source": headers["ce_source"].decode(),
                            "event_id": headers["ce_id"].decode(),
                            "seq": json.loads(record.value)["seq"],
                            "sent_at": None,
                            "applied_at": time.time(),
                        }
                    )
                async with engine.begin() as connection:
                    await connection.execute(statement, rows)
                await consumer.commit({tp: records[-1].offset + 1})
                done += len(records)
        return time.perf_counter() - started
    finally:
        await consumer.stop()
        await engine.dispose()


async def runtime(
    bootstrap: str,
    topic: str,
    url: str,
    expected: int,
    effect: Effect = "batch",
    **options: Any,
) -> float:
    """Seconds for a ConsumerRuntime (inbox dedupe) whose handler writes ``effect``."""
    app = make_app(topic, effect=effect, **options)
    consumer = ConsumerRuntime(
        app,
        kafka=KafkaSettings(bootstrap=bootstrap),
        db_url=url,
        group=f"runtime-{uuid.uuid4().hex[:6]}",
    )
    task = asyncio.create_task(consumer.run())
    try:
        while not consumer.stats.received:
            if task.done():
                task.result()
            await asyncio.sleep(0.002)
        started = time.perf_counter()
        while consumer.stats.applied + consumer.stats.duplicates < expected:
            if task.done():
                task.result()
                raise RuntimeError("the consumer runtime stopped on its own")
            await asyncio.sleep(0.005)
        return time.perf_counter() - started
    finally:
        await asyncio.wait_for(consumer.stop(), 60)
        await task


async def runtime_each(bootstrap: str, topic: str, url: str, expected: int) -> float:
    """Seconds for a ConsumerRuntime whose per-event handler executes one INSERT."""
    return await runtime(bootstrap, topic, url, expected, effect="each")


async def runtime_sequence(bootstrap: str, topic: str, url: str, expected: int) -> float:
    """Seconds for the batch-handler runtime with ``on_dead_letter="sequence"`` (no poison
    record: what the blocked-key check costs on the hot path)."""
    return await runtime(bootstrap, topic, url, expected, on_dead_letter="sequence")


async def runtime_without_sql(bootstrap: str, topic: str, url: str, expected: int) -> float:
    """Seconds for a ConsumerRuntime whose handler executes no statement."""
    return await runtime(bootstrap, topic, url, expected, effect="none")


SIDES = {
    "baseline": ("baseline: aiokafka + batched inserts", baseline, bench_effects),
    "runtime": ("runtime: inbox + batch handler (one INSERT per chunk)", runtime, bench_effects),
    "sequence": (
        "runtime: as above, on_dead_letter='sequence'",
        runtime_sequence,
        bench_effects,
    ),
    "each": ("runtime: inbox + one INSERT per event", runtime_each, bench_effects),
    "ceiling": ("runtime, handler without SQL", runtime_without_sql, inbox_events),
}


def main() -> None:
    """Produce once, run the sides ``--repeat`` times, interleaved; print rates and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each side, interleaved")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the no-SQL runtime")
    parser.add_argument(
        "--sides",
        default=",".join(SIDES),
        help=f"comma-separated sides to run, of {', '.join(SIDES)} (baseline always runs)",
    )
    parser.add_argument(
        "--gc-defaults",
        action="store_true",
        help="run the runtime sides with Python's GC defaults, not as outboxkit consume does",
    )
    args = parser.parse_args()
    chosen = {"baseline", *args.sides.split(",")}
    if unknown := chosen - set(SIDES):
        parser.error(f"unknown side(s): {', '.join(sorted(unknown))}")
    sides = [s for s in SIDES if s in chosen and (s != "ceiling" or not args.no_ceiling)]
    events = sample_events(args.events, 1000, args.keys)
    topic = f"consume-{uuid.uuid4().hex[:6]}"
    runs: list[dict[str, float]] = []
    with kafka() as bootstrap:
        asyncio.run(create_topic(bootstrap, topic, args.partitions))
        asyncio.run(produce(bootstrap, topic, events))
        del events  # a consumer process does not hold them: neither do the sides
        gc.collect()
        for _ in range(args.repeat):
            run: dict[str, float] = {}
            for side in sides:
                _, measure, table = SIDES[side]
                tuned = side != "baseline" and not args.gc_defaults
                with postgres_database() as url:
                    create_effects_table(url)
                    with gc_as_in_outboxkit_consume() if tuned else contextlib.nullcontext():
                        run[side] = asyncio.run(measure(bootstrap, topic, url, args.events))
                    rows = asyncio.run(count_rows(url, table))
                assert rows == args.events, f"{side}: {rows} {table.name} rows of {args.events}"
            runs.append(run)
    table_rows: list[list[Any]] = []
    for n, run in enumerate(runs, 1):
        for side in sides:
            ratio = run["baseline"] / run[side]
            table_rows.append(
                [
                    n,
                    SIDES[side][0],
                    run[side],
                    args.events / run[side],
                    "-" if side == "baseline" else f"{ratio:.2f}",
                ]
            )
    report(
        "consumer_throughput",
        f"{args.events:,} CloudEvents of ~1 KB, {args.partitions} partitions, PostgreSQL",
        ["run", "side", "seconds", "events/s", "ratio"],
        table_rows,
        {
            "events": args.events,
            "partitions": args.partitions,
            "runtime_gc": "python defaults" if args.gc_defaults else "as outboxkit consume",
            "runs": [
                {
                    **{f"{side}_seconds": run[side] for side in sides},
                    **{f"{side}_per_s": args.events / run[side] for side in sides},
                    **{
                        f"{side}_ratio": run["baseline"] / run[side]
                        for side in sides
                        if side != "baseline"
                    },
                }
                for run in runs
            ],
            "target": TARGET,
        },
    )
    if "runtime" in sides:
        ratios = ", ".join(f"{run['baseline'] / run['runtime']:.2f}" for run in runs)
        print(f"ratio runtime/baseline = {ratios} (target >= {TARGET})")
    if "runtime" in sides and "sequence" in sides:
        ratios = ", ".join(f"{run['runtime'] / run['sequence']:.2f}" for run in runs)
        print(f"ratio sequence/runtime = {ratios} (target >= {SEQUENCE_TARGET})")


if __name__ == "__main__":
    main()
