"""Shared pieces of the benchmarks: a broker, a throwaway database, bulk rows, reporting."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from outboxkit.cli.consume import tune_gc
from outboxkit.outbox import encode_binary, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.tables import outbox_events
from outboxkit.outbox.writer import outbox_row
from outboxkit.testing.kafka import broker_from_env
from outboxkit.testing.postgres import throwaway_database
from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).parent / "results"


kafka = broker_from_env  # OUTBOXKIT_KAFKA_BOOTSTRAP if set, else a fresh local broker


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` by nearest rank (0 if empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, migrated database on the server of ``OUTBOXKIT_TEST_PG_URL``; dropped after."""
    with throwaway_database("outboxkit_bench") as url:
        yield url


def sample_events(count: int, data_bytes: int, keys: int, source: str = "/bench") -> list:
    """``count`` CloudEvents of about ``data_bytes`` of JSON data over ``keys`` keys."""
    filler = "x" * max(0, data_bytes - 40)
    return [
        new_event("bench.event", source, {"seq": n, "fill": filler}, partitionkey=f"k{n % keys}")
        for n in range(count)
    ]


@contextmanager
def gc_as_in_outboxkit_consume() -> Iterator[None]:
    """Python's garbage collector set up as ``outboxkit consume`` sets it up in its process
    (``outboxkit.cli.consume.tune_gc``), for a consumer run inside the bench process; the
    defaults are restored after it."""
    threshold = gc.get_threshold()
    tune_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def bulk_fill(
    url: str, topic: str, events: list, chunk: int = 5000, per_transaction: int | None = None
) -> None:
    """Insert encoded events straight into the outbox (set-up only, not what is measured).

    One transaction for all, or one per ``per_transaction`` events (a logical slot then sees
    many small transactions, as from many producers)."""
    engine = make_engine(url)
    now_ms = int(time.time() * 1000)
    size = per_transaction or len(events) or 1
    times = {"created_ms": now_ms, "available_ms": now_ms, "attempts": 0}
    for first in range(0, len(events), size):
        with engine.begin() as conn:
            part = events[first : first + size]
            for start in range(0, len(part), chunk):
                rows = [
                    outbox_row(encode_binary(event), topic) | times
                    for event in part[start : start + chunk]
                ]
                conn.execute(outbox_events.insert(), rows)
    engine.dispose()


def report(name: str, title: str, columns: list[str], rows: list[list[Any]], data: dict) -> None:
    """Print a table and write ``bench/results/NAME.json``."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(f"{v:,.2f}" if isinstance(v, float) else str(v) for v in row))
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2, default=str))
    print(f"wrote {RESULTS / f'{name}.json'}")


async def produce_batches(
    bootstrap: str, topic: str, partitions: int, records: Iterable[tuple[Any, Any, Any]]
) -> None:
    """Send ``(key, value, headers)`` records through aiokafka's batch API, fast, the batches
    round-robin over the partitions (set-up only, not what is measured)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=512 * 1024)
    await producer.start()
    try:
        pending = []
        batch, partition = producer.create_batch(), 0
        for key, value, headers in records:
            while batch.append(timestamp=None, key=key, value=value, headers=headers) is None:
                pending.append(await producer.send_batch(batch, topic, partition=partition))
                batch, partition = producer.create_batch(), (partition + 1) % partitions
            if len(pending) >= 50:
                await asyncio.gather(*pending)
                pending = []
        pending.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
