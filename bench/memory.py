"""Peak memory (RSS high-water mark) of a relay process and of a consumer process, big backlogs.

Relay: the outbox is filled with N rows (default 1,000,000, ~200 bytes of data each) before the
relay starts, so the whole backlog is waiting at once. Consumer: N records (default 1,000,000,
~200 bytes each, binary-mode CloudEvents) are produced to a topic before ``outboxkit consume
bench.consumer_app:app`` starts; it applies each as an effect row. Each process must stay
bounded whatever the backlog. The peak is the kernel's ``VmHWM`` of the process, read just
before it is stopped. Usage:

    python -m bench.memory [--side relay|consumer|both] [--rows 1000000] [--records 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

from outboxkit.outbox import encode_binary, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.tables import outbox_events
from outboxkit.testing.kafka import create_topic
from outboxkit.testing.processes import start_cli
from sqlalchemy import func, select

from bench.common import (
    bulk_fill,
    kafka,
    postgres_database,
    produce_batches,
    report,
    sample_events,
)
from bench.consumer_app import EVENT_TYPE, bench_effects, create_effects_table

PARTITIONS = 3


def peak_rss_mb(pid: int) -> float:
    """The process's resident-set high-water mark in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc status")


def pending(url: str) -> int:
    """Rows not yet published."""
    engine = make_engine(url)
    with engine.connect() as conn:
        count = conn.scalar(
            select(func.count())
            .select_from(outbox_events)
            .where(outbox_events.c.published_ms.is_(None))
        )
    engine.dispose()
    return count


def relay_peak(url: str, bootstrap: str, rows: int) -> tuple[float, float]:
    """Run a relay process until the backlog is drained; return (peak MiB, seconds)."""
    relay = start_cli(
        [
            "relay",
            "--db-url",
            url,
            "--bootstrap",
            bootstrap,
            "--batch-size",
            "1000",
            "--retention",
            "3600",
            "--no-listen",
        ],
        Path(os.devnull),
    )
    started = time.perf_counter()
    peak = 0.0
    try:
        while pending(url) > 0:
            peak = max(peak, peak_rss_mb(relay.pid))
            time.sleep(1)
        elapsed = time.perf_counter() - started
        peak = max(peak, peak_rss_mb(relay.pid))
    finally:
        relay.terminate()
        relay.wait(60)
    return peak, elapsed


async def produce_backlog(bootstrap: str, topic: str, records: int) -> None:
    """Produce ``records`` binary-mode CloudEvents of ~200 bytes, in big batches, fast."""
    await create_topic(bootstrap, topic, PARTITIONS)
    template = encode_binary(new_event(EVENT_TYPE, "/bench", {"seq": 0}))
    fixed = [(k, v.encode()) for k, v in template.headers.items() if k != "ce_id"]
    fill = "x" * 150
    records_iter = (
        (
            None,
            f'{{"seq": {seq}, "fill": "{fill}"}}'.encode(),
            [*fixed, ("ce_id", f"m-{seq}".encode())],
        )
        for seq in range(records)
    )
    await produce_batches(bootstrap, topic, PARTITIONS, records_iter)


def applied(url: str) -> int:
    """Effect rows written so far."""
    engine = make_engine(url)
    with engine.connect() as conn:
        count = conn.scalar(select(func.count()).select_from(bench_effects))
    engine.dispose()
    return count


def consumer_peak(url: str, bootstrap: str, topic: str, records: int) -> tuple[float, float]:
    """Run a consumer process until every record is applied; return (peak MiB, seconds)."""
    create_effects_table(url)
    with tempfile.NamedTemporaryFile("w+b", suffix=".log") as log:
        consumer = start_cli(
            [
                "consume",
                "bench.consumer_app:app",
                "--db-url",
                url,
                "--bootstrap",
                bootstrap,
                "--group",
                f"mem-{topic}",
            ],
            Path(log.name),
            env={"OUTBOXKIT_BENCH_TOPIC": topic},
        )
        started = time.perf_counter()
        peak = 0.0
        try:
            while (done := applied(url)) < records:
                if consumer.poll() is not None:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"consumer exited with {consumer.returncode}: {tail}")
                peak = max(peak, peak_rss_mb(consumer.pid))
                time.sleep(5 if records - done > 10_000 else 0.5)
            elapsed = time.perf_counter() - started
            peak = max(peak, peak_rss_mb(consumer.pid))
        finally:
            consumer.terminate()
            consumer.wait(60)
    return peak, elapsed


def main() -> None:
    """Build each backlog, work through it with a process, print its peak RSS."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=["relay", "consumer", "both"], default="both")
    parser.add_argument("--rows", type=int, default=1_000_000, help="relay backlog")
    parser.add_argument("--records", type=int, default=1_000_000, help="consumer backlog")
    args = parser.parse_args()
    with kafka() as bootstrap:
        if args.side in ("relay", "both"):
            topic = f"mem-{uuid.uuid4().hex[:6]}"
            with postgres_database() as url:
                for start in range(0, args.rows, 100_000):
                    bulk_fill(url, topic, sample_events(min(100_000, args.rows - start), 200, 1000))
                peak, seconds = relay_peak(url, bootstrap, args.rows)
            report(
                "memory_relay",
                f"relay draining {args.rows:,} rows",
                ["process", "peak RSS MiB", "target MiB", "seconds", "rows/s"],
                [["relay", peak, 150, seconds, args.rows / seconds]],
                {
                    "rows": args.rows,
                    "relay_peak_rss_mib": peak,
                    "seconds": seconds,
                    "target_mib": 150,
                },
            )
        if args.side in ("consumer", "both"):
            topic = f"mem-{uuid.uuid4().hex[:6]}"
            asyncio.run(produce_backlog(bootstrap, topic, args.records))
            with postgres_database() as url:
                peak, seconds = consumer_peak(url, bootstrap, topic, args.records)
            report(
                "memory_consumer",
                f"consumer applying a backlog of {args.records:,} records",
                ["process", "peak RSS MiB", "target MiB", "seconds", "records/s"],
                [["outboxkit consume", peak, 250, seconds, args.records / seconds]],
                {
                    "records": args.records,
                    "consumer_peak_rss_mib": peak,
                    "seconds": seconds,
                    "target_mib": 250,
                },
            )


if __name__ == "__main__":
    main()
