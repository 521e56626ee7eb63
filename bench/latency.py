"""Commit-to-Kafka and commit-to-effect latency at a steady rate (relay woken by LISTEN/NOTIFY).

Writers (a process of their own) commit single-event transactions at a steady total rate
(default 1,000 events/s) into PostgreSQL; a relay process publishes them; a plain consumer in
this process stamps each record when it arrives (commit-to-Kafka); a consumer runtime process
(``outboxkit consume bench.consumer_app:app``) applies each event as an effect row stamped with
the time its handler ran (commit-to-effect: relay, broker, fetch, decoding, inbox claim and
handler; the chunk's database commit follows within a few ms). Both run from the moment the
writer's COMMIT returned (the writer process records it per event). Usage:

    python -m bench.latency [--rate 1000] [--seconds 20] [--no-consumer] [--modes poll,logical]

``--modes`` runs the relay in each mode in turn (a fresh database each), reported side by side:
``poll``, ``logical`` (the slot streamed over the replication protocol), ``logical-sql`` (peeked
with SQL) and ``logical-wal`` (streamed; the producers write WAL messages, not rows).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine
from outboxkit.testing.kafka import create_topic
from outboxkit.testing.processes import start_cli
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from bench.common import kafka, percentile, postgres_database, report
from bench.consumer_app import EVENT_TYPE, bench_effects, create_effects_table

WRITERS = 8
PARTITIONS = 3


def write_in_own_process(
    url: str, topic: str, rate: int, seconds: float, out: str, wal_messages: bool = False
) -> None:
    """Entry point of the writer process: the writers must not share the reader's event loop,
    or the reader would stamp arrivals late whenever a writer holds the loop. Writes each
    event's commit time (``{seq: epoch seconds}``) as JSON to ``out``."""
    committed = asyncio.run(write_steadily(url, topic, rate, seconds, wal_messages))
    Path(out).write_text(json.dumps(committed))


async def write_steadily(
    url: str, topic: str, rate: int, seconds: float, wal_messages: bool = False
) -> dict[int, float]:
    """Commit ``rate`` single-event transactions per second for ``seconds``; return when each
    event's COMMIT returned (epoch seconds, by ``seq``)."""
    engine = make_async_engine(url, pool_size=WRITERS)
    outbox = Outbox(default_topic=topic, wal_messages=wal_messages)
    per_writer_interval = WRITERS / rate
    total = int(rate * seconds)
    started = time.perf_counter()
    committed: dict[int, float] = {}

    async def writer(index: int) -> None:
        for n in range(index, total, WRITERS):
            due = started + (n // WRITERS) * per_writer_interval
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            async with AsyncSession(engine) as session, session.begin():
                data = {"seq": n, "sent_at": time.time()}
                await outbox.add_async(
                    session, new_event(EVENT_TYPE, "/bench", data, partitionkey=str(n % 50))
                )
            committed[n] = time.time()

    await asyncio.gather(*(writer(i) for i in range(WRITERS)))
    await engine.dispose()
    return committed


async def collect(bootstrap: str, topic: str, expected: int, timeout: float) -> dict[int, float]:
    """When each of ``expected`` records arrived (epoch seconds, by ``seq``)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id=None,
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    arrivals: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(arrivals) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            arrived = time.time()
            for record in (r for rs in batch.values() for r in rs):
                arrivals.setdefault(json.loads(record.value)["seq"], arrived)
    finally:
        await consumer.stop()
    return arrivals


async def wait_for_log(log: Path, text: str, timeout: float) -> None:
    """Wait until ``text`` appears in ``log``."""
    deadline = time.monotonic() + timeout
    while text not in (log.read_text() if log.exists() else ""):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {text!r} in {log} after {timeout}s")
        await asyncio.sleep(0.1)


async def effect_times(url: str, expected: int, timeout: float) -> dict[int, float]:
    """Once ``expected`` effects exist, when each event's handler ran (epoch seconds)."""
    engine = make_async_engine(url)
    deadline = time.monotonic() + timeout
    try:
        async with engine.connect() as connection:
            count = select(func.count()).select_from(bench_effects)
            while await connection.scalar(count) < expected:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            rows = await connection.execute(select(bench_effects.c.seq, bench_effects.c.applied_at))
            return {seq: applied for seq, applied in rows}
    finally:
        await engine.dispose()


def since_commit(committed: dict[int, float], times: dict[int, float]) -> list[float]:
    """Milliseconds from each event's COMMIT to its time in ``times``."""
    return [(times[seq] - committed[seq]) * 1000 for seq in times if seq in committed]


async def measure(
    url: str,
    bootstrap: str,
    rate: int,
    seconds: float,
    consume: bool,
    logs: Path,
    mode: str = "poll",
) -> tuple[list[float], list[float]]:
    """Commit-to-Kafka latencies, and commit-to-effect ones if ``consume``."""
    topic = f"lat-{uuid.uuid4().hex[:6]}"
    await create_topic(bootstrap, topic, PARTITIONS)
    processes = [
        start_cli(
            [
                "relay",
                "--db-url",
                url,
                "--bootstrap",
                bootstrap,
                "--poll-interval",
                "5",
                "--retention",
                "3600",
                "--mode",
                mode.split("-")[0],
                *(["--logical-reader", "sql"] if mode == "logical-sql" else []),
            ],
            logs / "relay.log",
        )
    ]
    try:
        if consume:
            create_effects_table(url)
            consumer_log = logs / "consumer.log"
            processes.append(
                start_cli(
                    [
                        "consume",
                        "bench.consumer_app:app",
                        "--db-url",
                        url,
                        "--bootstrap",
                        bootstrap,
                        "--group",
                        f"lat-{topic}",
                    ],
                    consumer_log,
                    env={"OUTBOXKIT_BENCH_TOPIC": topic},
                )
            )
            await wait_for_log(consumer_log, "partitions assigned", 60)
        expected = int(rate * seconds)
        reader = asyncio.create_task(collect(bootstrap, topic, expected, seconds + 60))
        await asyncio.sleep(3)  # relay start-up and reader assignment are not measured
        commits = logs / "commits.json"
        writers = multiprocessing.get_context("spawn").Process(
            target=write_in_own_process,
            args=(url, topic, rate, seconds, str(commits), mode == "logical-wal"),
        )
        writers.start()
        await asyncio.to_thread(writers.join)
        if writers.exitcode != 0:
            raise RuntimeError(f"writer process failed with exit code {writers.exitcode}")
        committed = {int(seq): at for seq, at in json.loads(commits.read_text()).items()}
        to_kafka = since_commit(committed, await reader)
        to_effect = (
            since_commit(committed, await effect_times(url, expected, 60)) if consume else []
        )
        return to_kafka, to_effect
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)


def main() -> None:
    """Run at a steady rate and print p50/p99 of both latencies."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--no-consumer", action="store_true", help="only commit-to-Kafka, no consumer process"
    )
    parser.add_argument("--modes", default="poll", help="relay modes, comma-separated")
    args = parser.parse_args()
    consume = not args.no_consumer
    expected = int(args.rate * args.seconds)
    rows: list[list] = []
    data: dict = {"rate": args.rate, "events": expected, "load_average": os.getloadavg()}
    for mode in args.modes.split(","):
        with (
            tempfile.TemporaryDirectory() as logs,
            kafka() as bootstrap,
            postgres_database() as url,
        ):
            to_kafka, to_effect = asyncio.run(
                measure(url, bootstrap, args.rate, args.seconds, consume, Path(logs), mode)
            )
        assert len(to_kafka) == expected, f"received {len(to_kafka)} of {expected}"
        if consume:
            assert len(to_effect) == expected, f"{len(to_effect)} effects of {expected}"
        suffix = "" if mode == "poll" else f"_{mode.replace('-', '_')}"
        for name, values, p50_target, p99_target in (
            ("commit-to-Kafka", to_kafka, 10.0, 50.0 if mode == "poll" else 20.0),
            ("commit-to-effect", to_effect, "-", "-"),
        ):
            if not values:
                continue
            p50, p99 = percentile(values, 50), percentile(values, 99)
            rows += [
                [f"{name} ({mode})", "p50", p50, p50_target],
                [f"{name} ({mode})", "p99", p99, p99_target],
                [f"{name} ({mode})", "mean", statistics.fmean(values), "-"],
            ]
            key = name.replace("-", "_").lower() + suffix
            data.update({f"{key}_p50_ms": p50, f"{key}_p99_ms": p99, f"{key}_max_ms": max(values)})
    report(
        "latency",
        f"latency at {args.rate}/s for {args.seconds:.0f}s (LISTEN/NOTIFY)",
        ["path", "measure", "ms", "target ms"],
        rows,
        data,
    )


if __name__ == "__main__":
    main()
