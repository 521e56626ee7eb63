"""Peak memory (RSS high-water mark) of a relay process draining a large backlog.

The outbox is filled with N rows (default 1,000,000, ~200 bytes of data each) before the relay
starts, so the whole backlog is waiting at once; the relay must stay bounded whatever its size.
The peak is the kernel's ``VmHWM`` of the relay process, read just before it exits. Usage:

    python -m bench.memory [--rows 1000000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import func, select

from bench.common import bulk_fill, kafka, postgres_database, report, sample_events
from outbox.db import make_engine
from outbox.tables import outbox_events


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
            "--batch-size",
            "1000",
            "--retention",
            "3600",
            "--no-listen",
        ],
        stderr=subprocess.DEVNULL,
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


def main() -> None:
    """Fill the outbox, drain it with a relay process, print its peak RSS."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    topic = f"mem-{uuid.uuid4().hex[:6]}"
    with kafka() as bootstrap, postgres_database() as url:
        for start in range(0, args.rows, 100_000):
            bulk_fill(url, topic, sample_events(min(100_000, args.rows - start), 200, 1000))
        peak, seconds = relay_peak(url, bootstrap, args.rows)
    report(
        "memory_relay",
        f"relay draining {args.rows:,} rows",
        ["process", "peak RSS MiB", "target MiB", "seconds", "rows/s"],
        [["relay", peak, 150, seconds, args.rows / seconds]],
        {"rows": args.rows, "relay_peak_rss_mib": peak, "seconds": seconds, "target_mib": 150},
    )


if __name__ == "__main__":
    main()
