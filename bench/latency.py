"""Commit-to-Kafka latency at a steady rate, with the relay woken by LISTEN/NOTIFY.

Writers commit single-event transactions at a steady total rate (default 1,000 events/s) into
PostgreSQL; a relay process publishes them; a consumer in this process stamps each record when
it arrives. Latency runs from just before COMMIT (the time is stored in the event) to arrival,
so it slightly overstates the true commit-to-Kafka time. Usage:

    python -m bench.latency [--rate 1000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid

from aiokafka import AIOKafkaConsumer
from sqlalchemy.ext.asyncio import AsyncSession

from bench.common import kafka, postgres_database, report
from outbox import Outbox, new_event
from outbox.db import make_async_engine

WRITERS = 8


async def write_steadily(url: str, topic: str, rate: int, seconds: float) -> int:
    """Commit ``rate`` single-event transactions per second for ``seconds``; return the count."""
    engine = make_async_engine(url, pool_size=WRITERS)
    outbox = Outbox(default_topic=topic)
    per_writer_interval = WRITERS / rate
    total = int(rate * seconds)
    started = time.perf_counter()

    async def writer(index: int) -> None:
        for n in range(index, total, WRITERS):
            due = started + (n // WRITERS) * per_writer_interval
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            async with AsyncSession(engine) as session, session.begin():
                data = {"n": n, "sent_at": time.time()}
                await outbox.add_async(
                    session, new_event("lat", "/bench", data, partitionkey=str(n % 50))
                )

    await asyncio.gather(*(writer(i) for i in range(WRITERS)))
    await engine.dispose()
    return total


async def collect(bootstrap: str, topic: str, expected: int, timeout: float) -> list[float]:
    """Latencies in ms of ``expected`` records, read as they arrive."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id=None,
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    latencies: list[float] = []
    deadline = time.monotonic() + timeout
    try:
        while len(latencies) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            arrived = time.time()
            for record in (r for rs in batch.values() for r in rs):
                latencies.append((arrived - json.loads(record.value)["sent_at"]) * 1000)
    finally:
        await consumer.stop()
    return latencies


async def measure(url: str, bootstrap: str, rate: int, seconds: float) -> list[float]:
    topic = f"lat-{uuid.uuid4().hex[:6]}"
    relay = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from outbox.cli import main; main()",
            "relay",
            "--db-url",
            url,
            "--bootstrap",
            bootstrap,
            "--poll-interval",
            "5",
            "--retention",
            "3600",
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        expected = int(rate * seconds)
        reader = asyncio.create_task(collect(bootstrap, topic, expected, seconds + 60))
        await asyncio.sleep(3)  # relay start-up and consumer assignment are not measured
        await write_steadily(url, topic, rate, seconds)
        return await reader
    finally:
        relay.terminate()
        relay.wait(30)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def main() -> None:
    """Run at a steady rate and print p50/p99."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with kafka() as bootstrap, postgres_database() as url:
        latencies = asyncio.run(measure(url, bootstrap, args.rate, args.seconds))
    expected = int(args.rate * args.seconds)
    assert len(latencies) == expected, f"received {len(latencies)} of {expected}"
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    report(
        "latency",
        f"commit-to-Kafka at {args.rate}/s for {args.seconds:.0f}s (LISTEN/NOTIFY)",
        ["measure", "ms", "target ms"],
        [["p50", p50, 10.0], ["p99", p99, 50.0], ["mean", statistics.fmean(latencies), "-"]],
        {
            "rate": args.rate,
            "events": expected,
            "p50_ms": p50,
            "p99_ms": p99,
            "max_ms": max(latencies),
        },
    )


if __name__ == "__main__":
    main()
