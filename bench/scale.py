"""Throughput as relay processes share one outbox, and as consumer processes share one group.

Relay: for each count K of ``--relays`` (default 1, 2, 4), K ``outboxkit relay`` processes run
on one fresh PostgreSQL outbox (polling every 50 ms, batches of 1,000). Once the relays have
spread the 64 shard leases among themselves, N CloudEvents of about 1 KB (``--keys`` keys, so
every shard has rows) are committed to the outbox in one transaction and the table is analyzed
(see :func:`analyze_outbox`); the clock runs from that commit until the topic (``--partitions``
partitions) holds N records. ``--relay-mode`` is passed to ``outboxkit relay --mode`` when the
command has that option (otherwise only ``poll`` runs);
in ``logical`` mode the bench waits for the replication slot instead of the leases, and since one
relay reads a slot while the others stand by, more relays measure the standbys' cost, not scale.

Consumer: for each count K of ``--consumers`` (default 1, 2, 4), K ``outboxkit consume
bench.consumer_app:app`` processes (batch handler, inbox dedupe) join one group on a fresh topic
of ``--partitions`` partitions. Once the group has spread the partitions, N pre-encoded records
of about 1 KB are produced (aiokafka's batch API); the clock runs from the first send until
every effect row is written (the last row's ``applied_at``, stamped by the handler).

Both report events/s, events/s per process, and CPU seconds of the relay or consumer processes
(``psutil``, user + system, from the start to the end of the clock): events per CPU-second is
what one core spent on that process type delivers. ``DB CPU s``: the CPU seconds of the
PostgreSQL backends connected to the run's database over the same window (the server's shared
processes, WAL writer and checkpointer, are not in it). The machine's busy share of all cores over
the same window (``/proc/stat``) says when the machine, not the process, was the limit, and
the load average when the run ended whether other work shared it.
Usage:

    python -m bench.scale [--events 100000] [--relays 1,2,4] [--consumers 1,2,4]
        [--partitions 6] [--relay-mode poll] [--sides relay,consumer] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer, TopicPartition
from outboxkit.outbox import encode_binary
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.sharding import SHARD_COUNT
from outboxkit.outbox.tables import outbox_shard_leases
from outboxkit.testing.kafka import create_topic
from outboxkit.testing.processes import start_cli, terminate
from sqlalchemy import func, select, text

from bench.common import bulk_fill, kafka, postgres_database, produce_batches, report, sample_events
from bench.consumer_app import bench_effects, create_effects_table

SETTLE_TIMEOUT_S = 90.0  # for leases or partitions to spread over the processes
RUN_TIMEOUT_S = 600.0
LEASE_TTL_S = 20.0  # the shortest the relay accepts: a heartbeat every 6.7 s


@dataclass
class Measured:
    """One run: K processes, N events, wall seconds, CPU seconds of those processes."""

    side: str
    processes: int
    events: int
    seconds: float
    cpu_seconds: float
    database_cpu_seconds: float  # of the PostgreSQL backends serving the bench's database
    machine_busy: float  # share of all cores busy over the window, 0..1
    load: float = 0.0  # the machine's 1-minute load average when the run ended
    round: int = 0

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    @property
    def per_cpu_second(self) -> float:
        return self.events / self.cpu_seconds


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user
    return total - idle, total


def backend_cpu(url: str) -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL backend connected to the database of ``url``
    (the server runs on this machine; other sessions' backends serve other databases)."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            pids = connection.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            ).scalars()
            found = {}
            for pid in pids:
                try:
                    times = psutil.Process(pid).cpu_times()
                except psutil.Error:
                    continue
                found[pid] = times.user + times.system
    finally:
        engine.dispose()
    return found


def backend_cpu_since(url: str, before: dict[int, float]) -> float:
    """CPU seconds the database's backends used since ``before`` (new backends: all theirs)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in backend_cpu(url).items())


def cpu_seconds(processes: list[subprocess.Popen[bytes]]) -> float:
    """User + system CPU seconds the processes used so far (their children included)."""
    total = 0.0
    for process in processes:
        handle = psutil.Process(process.pid)
        times = handle.cpu_times()
        total += times.user + times.system
        for child in handle.children(recursive=True):
            child_times = child.cpu_times()
            total += child_times.user + child_times.system
    return total


@contextmanager
def processes(
    command: Callable[[int], list[str]], count: int, env: dict[str, str] | None = None
) -> Iterator[tuple[list[subprocess.Popen[bytes]], list[Path]]]:
    """``count`` CLI processes (``command(i)``), each logging to a file; stopped after."""
    with tempfile.TemporaryDirectory(prefix="outboxkit-scale-") as folder:
        logs = [Path(folder) / f"{i}.log" for i in range(count)]
        started = [start_cli(command(i), log, env=env) for i, log in enumerate(logs)]
        try:
            yield started, logs
        finally:
            for process in started:
                process.terminate()
            for process in started:
                terminate(process, 60)


def check_alive(started: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    """Fail with the log's tail if a process exited."""
    for process, log in zip(started, logs, strict=True):
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"process exited with {process.returncode}: {tail}")


def wait_until(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float,
    started: list[subprocess.Popen[bytes]],
    logs: list[Path],
    every_s: float = 0.5,
) -> None:
    """Poll ``condition`` until true; fail on a deadline or a process exit."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        check_alive(started, logs)
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every_s)


async def topic_size(bootstrap: str, topic: str, partitions: int) -> int:
    """Records in ``topic``: the sum of its partitions' end offsets."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return sum(ends.values())
    finally:
        await consumer.stop()


def relay_has_mode() -> bool:
    """Whether ``outboxkit relay`` takes ``--mode`` (the logical-decoding mode added it)."""
    result = subprocess.run(
        [sys.executable, "-c", "from outboxkit.cli.main import main; main()", "relay", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    return "--mode" in result.stdout


def leases_spread(url: str, relays: int) -> bool:
    """Whether ``relays`` relays hold every shard lease, none more than its fair share."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            held = dict(
                connection.execute(
                    select(outbox_shard_leases.c.holder, func.count())
                    .where(outbox_shard_leases.c.holder.is_not(None))
                    .group_by(outbox_shard_leases.c.holder)
                ).all()
            )
    finally:
        engine.dispose()
    fair = -(-SHARD_COUNT // relays)
    return len(held) == relays and sum(held.values()) == SHARD_COUNT and max(held.values()) <= fair


def slot_exists(url: str) -> bool:
    """Whether a replication slot of the database of ``url`` exists (logical mode made it)."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            found = connection.scalar(
                text(
                    "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()"
                )
            )
    finally:
        engine.dispose()
    return bool(found)


def drop_slots(url: str) -> None:
    """Drop the replication slots of the database of ``url`` (its relays have stopped)."""
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = current_database()"
                )
            )
    finally:
        engine.dispose()


def analyze_outbox(url: str) -> None:
    """Give the planner statistics of the filled outbox, as autovacuum does within a minute.

    The outbox went from empty to N rows in one commit; planned on the empty table's
    statistics, the relay's claim cost ten times the database CPU (2,400 against 16,500
    rows/s, 100,000 rows, measured side by side).
    """
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("ANALYZE outbox_events"))
    finally:
        engine.dispose()


def measure_relays(
    bootstrap: str, count: int, events: list[Any], partitions: int, mode: str | None
) -> Measured:
    """K relays on one outbox: seconds from the commit of N rows until Kafka holds them all."""
    topic = f"scale-relay-{uuid.uuid4().hex[:6]}"
    asyncio.run(create_topic(bootstrap, topic, partitions))
    with postgres_database() as url:

        def command(_: int) -> list[str]:
            args = [
                "relay",
                "--db-url",
                url,
                "--bootstrap",
                bootstrap,
                "--batch-size",
                "1000",
                "--retention",
                "3600",
                "--lease-ttl",
                str(LEASE_TTL_S),
                "--poll-interval",
                "0.05",
                "--no-listen",
            ]
            return args if mode is None else [*args, "--mode", mode]

        with processes(command, count) as (started, logs):
            if mode == "logical":  # one relay reads the slot, the others stand by
                wait_until(lambda: slot_exists(url), "a slot", SETTLE_TIMEOUT_S, started, logs)
            else:
                wait_until(
                    lambda: leases_spread(url, count),
                    "shard leases",
                    SETTLE_TIMEOUT_S,
                    started,
                    logs,
                )
            bulk_fill(url, topic, events)  # one transaction: the rows appear at once
            analyze_outbox(url)
            began, cpu_before, ticks_before = (
                time.perf_counter(),
                cpu_seconds(started),
                machine_ticks(),
            )
            database_before = backend_cpu(url)
            wait_until(
                lambda: asyncio.run(topic_size(bootstrap, topic, partitions)) >= len(events),
                "the relays to publish every row",
                RUN_TIMEOUT_S,
                started,
                logs,
                every_s=0.1,
            )
            seconds = time.perf_counter() - began
            cpu = cpu_seconds(started) - cpu_before
            busy = _busy_since(ticks_before)
            database = backend_cpu_since(url, database_before)
        if mode == "logical":
            drop_slots(url)  # a database with a logical slot cannot be dropped
    return Measured("relay", count, len(events), seconds, cpu, database, busy, os.getloadavg()[0])


def _busy_since(before: tuple[int, int]) -> float:
    busy, total = machine_ticks()
    return (busy - before[0]) / max(1, total - before[1])


ASSIGNED = re.compile(r"partitions (assigned|revoked): (.*)$")


def group_spread(logs: list[Path], partitions: int) -> bool:
    """Whether every consumer's latest rebalance line is an assignment, and together they
    hold each partition exactly once."""
    held: list[int] = []
    for log in logs:
        last = None
        for line in log.read_text(errors="replace").splitlines():
            if found := ASSIGNED.search(line):
                last = found
        if last is None or last.group(1) != "assigned":
            return False
        held += [int(p) for p in re.findall(r"\d+", last.group(2).partition("[")[2])]
    return sorted(held) == list(range(partitions))


def encoded_records(events: list[Any]) -> list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]:
    """(key, value, headers) of each event in binary mode, encoded before any clock runs."""
    records = []
    for event in events:
        encoded = encode_binary(event)
        headers = [(k, v.encode()) for k, v in encoded.headers.items()]
        records.append((encoded.key, encoded.payload, headers))
    return records


def effects_written(url: str) -> tuple[int, float | None]:
    """Effect rows so far, and the latest ``applied_at``."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            count, last = connection.execute(
                select(func.count(), func.max(bench_effects.c.applied_at))
            ).one()
    finally:
        engine.dispose()
    return int(count), last


def measure_consumers(bootstrap: str, count: int, records: list[Any], partitions: int) -> Measured:
    """K consumer processes in one group: seconds from the first send until every effect row
    is written."""
    topic = f"scale-consume-{uuid.uuid4().hex[:6]}"
    group = f"scale-{topic}"
    asyncio.run(create_topic(bootstrap, topic, partitions))
    with postgres_database() as url:
        create_effects_table(url)

        def command(_: int) -> list[str]:
            return [
                "consume",
                "bench.consumer_app:app",
                "--db-url",
                url,
                "--bootstrap",
                bootstrap,
                "--group",
                group,
            ]

        env = {"OUTBOXKIT_BENCH_TOPIC": topic}
        with processes(command, count, env) as (started, logs):
            wait_until(
                lambda: group_spread(logs, partitions), "the group", SETTLE_TIMEOUT_S, started, logs
            )
            cpu_before, ticks_before = cpu_seconds(started), machine_ticks()
            database_before = backend_cpu(url)
            began = time.time()
            asyncio.run(produce_batches(bootstrap, topic, partitions, records))
            done: list[tuple[int, float | None]] = []

            def all_applied() -> bool:
                done.append(effects_written(url))
                return done[-1][0] >= len(records)

            wait_until(all_applied, "every effect", RUN_TIMEOUT_S, started, logs, every_s=0.2)
            cpu = cpu_seconds(started) - cpu_before
            busy = _busy_since(ticks_before)
            database = backend_cpu_since(url, database_before)
    written, last_applied = done[-1]
    assert written == len(records), f"{written} effect rows of {len(records)}"
    assert last_applied is not None
    seconds = last_applied - began
    return Measured(
        "consumer", count, len(records), seconds, cpu, database, busy, os.getloadavg()[0]
    )


def main() -> None:
    """Run each process count of each side, ``--repeat`` times; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--relays", default="1,2,4", help="relay process counts")
    parser.add_argument("--consumers", default="1,2,4", help="consumer process counts")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--relay-mode", default="poll", help="outboxkit relay --mode, if it exists")
    parser.add_argument("--sides", default="relay,consumer")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("COLUMNS", "150")  # the table is wide; rich reads its width here
    sides = set(args.sides.split(","))
    if unknown := sides - {"relay", "consumer"}:
        parser.error(f"unknown side(s): {', '.join(sorted(unknown))}")
    mode: str | None = args.relay_mode
    if not relay_has_mode():
        if mode != "poll":
            parser.error("this outboxkit relay has no --mode: only --relay-mode poll runs")
        mode = None  # polling is all it does
    events = sample_events(args.events, 1000, args.keys)
    records = encoded_records(events) if "consumer" in sides else []
    runs: list[Measured] = []
    with kafka() as bootstrap:
        for round_ in range(1, args.repeat + 1):
            if "relay" in sides:
                for count in [int(c) for c in args.relays.split(",")]:
                    runs.append(measure_relays(bootstrap, count, events, args.partitions, mode))
                    runs[-1].round = round_
                    print(_line(runs[-1]), flush=True)
            if "consumer" in sides:
                for count in [int(c) for c in args.consumers.split(",")]:
                    runs.append(measure_consumers(bootstrap, count, records, args.partitions))
                    runs[-1].round = round_
                    print(_line(runs[-1]), flush=True)
    cores = psutil.cpu_count() or 1
    fewest: dict[tuple[str, int], Measured] = {}
    for run in runs:  # the run with the fewest processes of the same side and round
        key = (run.side, run.round)
        if key not in fewest or run.processes < fewest[key].processes:
            fewest[key] = run
    report(
        "scale",
        f"{args.events:,} events of ~1 KB, {args.partitions} partitions, {cores} cores, "
        f"relay mode {args.relay_mode}",
        [
            "round",
            "side",
            "procs",
            "s",
            "events/s",
            "vs fewest",
            "per proc",
            "CPU s",
            "per CPU-s",
            "DB CPU s",
            "busy",
            "load",
        ],
        [
            [
                run.round,
                run.side,
                run.processes,
                run.seconds,
                run.rate,
                f"{run.rate / fewest[(run.side, run.round)].rate:.2f}",
                run.rate / run.processes,
                run.cpu_seconds,
                run.per_cpu_second,
                run.database_cpu_seconds,
                f"{run.machine_busy:.0%}",
                f"{run.load:.1f}",
            ]
            for run in runs
        ],
        {
            "events": args.events,
            "partitions": args.partitions,
            "keys": args.keys,
            "cores": cores,
            "relay_mode": args.relay_mode,
            "runs": [
                {
                    "round": run.round,
                    "side": run.side,
                    "processes": run.processes,
                    "seconds": run.seconds,
                    "events_per_s": run.rate,
                    "cpu_seconds": run.cpu_seconds,
                    "events_per_cpu_second": run.per_cpu_second,
                    "database_cpu_seconds": run.database_cpu_seconds,
                    "machine_busy": run.machine_busy,
                    "load_average": run.load,
                }
                for run in runs
            ],
        },
    )


def _line(run: Measured) -> str:
    return (
        f"{run.side} x{run.processes}: {run.rate:,.0f} events/s, "
        f"{run.per_cpu_second:,.0f} per CPU-second, machine busy {run.machine_busy:.0%}, "
        f"load {run.load:.1f}"
    )


if __name__ == "__main__":
    main()
