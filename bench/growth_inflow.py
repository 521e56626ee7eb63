"""Retention under inflow for bench.growth: events written at a steady rate, relayed (poll
mode) and consumed (inbox + batch handler), while the outbox retention and the inbox window
slide; table sizes are printed every interval and each retention transaction is timed.

The relay and the consumer run as processes of their own (``outboxkit relay``, ``outboxkit
consume bench.consumer_app:app``), and so does the writer (:func:`_writer`). The relay's and
the consumer's own retention loops find nothing to delete (the relay's window is ten times
longer, the bench app has none) and the bench runs the same functions
(``relay.retention.delete_published``, ``consumers.inbox.purge_inbox`` with the partitions
attached ahead, as a consumer's retention pass does) on an engine of its own, so each of their
transactions is timed alone (BEGIN to COMMIT returning, or a statement in autocommit from
being sent to its result: the longest any of them can have held a lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from outboxkit.consumers.inbox import DEFAULT_PURGE_CHUNK, partitions_ahead_s, purge_inbox
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine
from outboxkit.relay.retention import delete_published
from outboxkit.testing.kafka import create_topic
from outboxkit.testing.processes import start_cli, terminate
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import async_sessionmaker

from bench.common import percentile
from bench.consumer_app import EVENT_TYPE, bench_effects
from bench.growth_tables import (
    TableStats,
    asyncpg_dsn,
    disk_writes,
    table_stats,
    timed_engine,
    wal_stats,
)
from bench.latency import wait_for_log

ROOT = Path(__file__).resolve().parents[1]
VACUUM_AFTER = 10_000  # rows a pass deletes before --inflow-vacuum vacuums the outbox
TICK_S = 0.1  # the writer commits one transaction of rate * TICK_S events per tick
CONSUMER = "bench"  # bench.consumer_app's name


@dataclass
class Sample:
    """The tables at one moment of the run."""

    at_s: float
    written: int
    consumed: int
    outbox: TableStats
    inbox: TableStats
    load: tuple[float, float, float]


@dataclass
class InflowResult:
    """What the run measured."""

    seconds: float
    written: int
    consumed: int
    window_s: float
    samples: list[Sample] = field(default_factory=list)
    outbox_purge_ms: list[float] = field(default_factory=list)
    inbox_purge_ms: list[float] = field(default_factory=list)
    outbox_lock_ms: list[float] = field(default_factory=list)
    inbox_lock_ms: list[float] = field(default_factory=list)
    outbox_server_ms: list[float] = field(default_factory=list)
    outbox_block_rows: list[int] = field(default_factory=list)
    """The rows each of :attr:`outbox_server_ms`'s blocks deleted."""
    inbox_server_ms: list[float] = field(default_factory=list)
    """How long each locked block ran inside the server (its commit excluded): the part of
    a lock hold of :attr:`outbox_lock_ms` / :attr:`inbox_lock_ms` that is not the round trip."""
    outbox_vacuum_ms: list[float] = field(default_factory=list)
    outbox_purged: int = 0
    inbox_purged: int = 0
    longest_holds: list[tuple[float, str]] = field(default_factory=list)
    """The five longest lock holds of retention (outbox and inbox), each with the statement
    it began with."""
    inbox_holds: list[tuple[float, str]] = field(default_factory=list)
    """Every lock hold of the inbox's retention, with the statement it began with."""
    server: str = ""
    """The server's checkpoints, WAL and full-page images during the run, and its WAL settings
    (:meth:`~bench.growth_tables.WalStats.since`)."""
    disk: str = ""
    """The machine's disk writes during the run (:meth:`~bench.growth_tables.DiskWrites.since`)."""
    loop_lag_ms: list[float] = field(default_factory=list)
    """How late the bench's event loop (the writer's and the retention's) woke a 10 ms sleep:
    time a retention statement's result waited to be seen, counted in its hold."""

    @property
    def write_rate(self) -> float:
        """Events written per second."""
        return self.written / self.seconds

    @property
    def consume_rate(self) -> float:
        """Events applied per second."""
        return self.consumed / self.seconds


async def _write(url: str, topic: str, rate: float, written: Any, stop: Any) -> None:
    """Commit ``rate * TICK_S`` outbox rows every tick until ``stop`` (a process event) is
    set, counting in ``written`` (a shared integer)."""
    engine = make_async_engine(url)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    outbox = Outbox(default_topic=topic)
    per_tick = max(1, round(rate * TICK_S))
    filler = "x" * 400
    try:
        next_tick = time.monotonic()
        while not stop.is_set():
            events = [
                new_event(
                    EVENT_TYPE,
                    "/growth",
                    {"seq": written.value + n, "fill": filler},
                    partitionkey=f"k{n % 100}",
                )
                for n in range(per_tick)
            ]
            async with sessions() as session, session.begin():
                await outbox.add_all_async(session, events)
            written.value += per_tick
            next_tick += TICK_S
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
    finally:
        await engine.dispose()


def _writer(url: str, topic: str, rate: float, written: Any, stop: Any) -> None:
    """The writer's process: :func:`_write` on an event loop of its own. Beside the retention
    in the bench's loop, building its events held that loop up to 179 ms (p99 90 ms), and a
    retention statement's result waited that long to be seen: time counted in its hold."""
    asyncio.run(_write(url, topic, rate, written, stop))


class _ServerTimes(logging.Handler):
    """Collects, from ``outboxkit.outbox.locked``'s debug records of this process, how long
    each locked block ran inside the server, and how many rows it changed."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.ms: list[float] = []
        self.rows: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record's server time (its third argument) and rows (its first)."""
        if isinstance(record.args, tuple) and len(record.args) == 3:
            self.rows.append(int(record.args[0]))
            self.ms.append(float(record.args[2]))

    def take(self) -> tuple[list[float], list[int]]:
        """The times and rows collected so far; the lists start afresh."""
        taken = (self.ms, self.rows)
        self.ms, self.rows = [], []
        return taken


async def _retain(
    url: str,
    window_s: float,
    interval_s: float,
    result: InflowResult,
    stop: asyncio.Event,
    *,
    vacuum: bool,
) -> None:
    """Every ``interval_s``: purge published outbox rows and inbox claims older than the
    window, each transaction timed; with ``vacuum``, a pass that deleted ``VACUUM_AFTER``
    outbox rows is followed by a plain ``VACUUM`` of the outbox (timed apart: it is no
    transaction and holds no row lock)."""
    engine, timer = timed_engine(url)
    blocks = logging.getLogger("outboxkit.outbox.locked")
    server = _ServerTimes()
    level, propagate = blocks.level, blocks.propagate
    blocks.addHandler(server)
    blocks.setLevel(logging.DEBUG)
    blocks.propagate = False  # collected, not printed
    try:
        while not stop.is_set():
            deleted = await delete_published(engine, int(window_s * 1000), 5000)
            result.outbox_purged += deleted
            transactions, locks = timer.take()
            result.outbox_purge_ms += transactions
            result.outbox_lock_ms += locks
            times, rows = server.take()
            result.outbox_server_ms += times
            result.outbox_block_rows += rows
            if vacuum and deleted >= VACUUM_AFTER:
                result.outbox_vacuum_ms.append(await _vacuum_outbox(url))
            result.inbox_purged += await purge_inbox(
                engine,
                consumer=CONSUMER,
                older_than_s=window_s,
                chunk_size=DEFAULT_PURGE_CHUNK,
                ahead_s=partitions_ahead_s(window_s, interval_s),
            )
            transactions, locks = timer.take()
            result.inbox_purge_ms += transactions
            result.inbox_lock_ms += locks
            statements = timer.lock_statements[len(timer.lock_statements) - len(locks) :]
            result.inbox_holds += zip(locks, statements, strict=True)
            result.inbox_server_ms += server.take()[0]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
    finally:
        result.longest_holds = timer.longest_holds(5)
        blocks.removeHandler(server)
        blocks.setLevel(level)
        blocks.propagate = propagate
        await engine.dispose()


async def _loop_lag(lags: list[float], stop: asyncio.Event) -> None:
    """Sleep 10 ms at a time until ``stop``, keeping how late each wake-up was."""
    while not stop.is_set():
        began = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append(max(0.0, (time.perf_counter() - began) * 1000 - 10))


async def _vacuum_outbox(url: str) -> float:
    """``VACUUM (SKIP_LOCKED) outbox_events`` (it cannot run in a transaction); ms it took."""
    began = time.perf_counter()
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await connection.execute("VACUUM (SKIP_LOCKED) outbox_events")
    finally:
        await connection.close()
    return (time.perf_counter() - began) * 1000


async def _applied(url: str) -> int:
    """Effect rows written by the consumer (its ids count them: no ``count(*)`` scan)."""
    engine = make_async_engine(url)
    try:
        async with engine.connect() as connection:
            return int(
                await connection.scalar(select(func.coalesce(func.max(bench_effects.c.id), 0)))
            )
    finally:
        await engine.dispose()


def _processes(url: str, bootstrap: str, topic: str, window_s: float, logs: Path) -> list[Any]:
    """A relay process (poll mode, LISTEN/NOTIFY) and a consumer process (inbox + batch
    handler), as deployed; their own retention finds nothing (the bench's runs first)."""
    relay = start_cli(
        ["relay", "--db-url", url, "--bootstrap", bootstrap, "--batch-size", "1000",
         "--poll-interval", "1s", "--retention", f"{int(window_s * 10)}s"],
        logs / "relay.log",
    )  # fmt: skip
    consumer = start_cli(
        ["consume", "bench.consumer_app:app", "--db-url", url, "--bootstrap", bootstrap,
         "--group", f"growth-{topic}"],
        logs / "consumer.log",
        env={"OUTBOXKIT_BENCH_TOPIC": topic, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    return [relay, consumer]


async def inflow(
    url: str,
    bootstrap: str,
    *,
    rate: float,
    seconds: float,
    window_s: float,
    sample_s: float,
    retention_every_s: float,
    vacuum: bool = False,
) -> InflowResult:
    """Write at ``rate`` for ``seconds`` (relay and consumer in processes of their own) with a
    ``window_s`` retention; sample the tables every ``sample_s``. ``vacuum``: the outbox
    is also vacuumed after a big retention pass (default: autovacuum alone, as deployed)."""
    topic = f"growth-inflow-{uuid.uuid4().hex[:6]}"
    await create_topic(bootstrap, topic, 3)
    logs = Path(tempfile.mkdtemp(prefix="growth-inflow-"))
    children = _processes(url, bootstrap, topic, window_s, logs)
    result = InflowResult(seconds=seconds, written=0, consumed=0, window_s=window_s)
    stop = asyncio.Event()
    processes = multiprocessing.get_context("spawn")
    written = processes.Value("q", 0)
    stop_writing = processes.Event()
    writer = processes.Process(
        target=_writer, args=(url, topic, rate, written, stop_writing), daemon=True
    )
    try:
        await wait_for_log(logs / "consumer.log", "partitions assigned", 120)
        writer.start()
        deadline = time.monotonic() + 60
        while written.value == 0:  # the writer's process has started and made its first tick
            if time.monotonic() > deadline or not writer.is_alive():
                raise RuntimeError("the writer's process did not start writing")
            await asyncio.sleep(0.05)
        wal_before, disk_before = await wal_stats(url), disk_writes()
        retention = asyncio.create_task(
            _retain(url, window_s, retention_every_s, result, stop, vacuum=vacuum)
        )
        lag = asyncio.create_task(_loop_lag(result.loop_lag_ms, stop))
        began = time.monotonic()
        try:
            while time.monotonic() - began < seconds:
                await asyncio.sleep(min(sample_s, max(0.0, seconds - (time.monotonic() - began))))
                if retention.done():
                    retention.result()
                if retention.done() or not writer.is_alive():
                    raise RuntimeError("a part of the inflow run stopped on its own")
                for child in children:
                    if child.poll() is not None:
                        raise RuntimeError(f"a bench process exited; see {logs}")
                sample = Sample(
                    at_s=round(time.monotonic() - began),
                    written=written.value,
                    consumed=await _applied(url),
                    outbox=await table_stats(url, "outbox_events"),
                    inbox=await table_stats(url, "inbox_events"),
                    load=os.getloadavg(),
                )
                result.samples.append(sample)
                longest = max(result.outbox_purge_ms + result.inbox_purge_ms, default=0.0)
                print(
                    f"  {sample.at_s:5.0f} s  written {sample.written:>9,}  applied "
                    f"{sample.consumed:>9,}  outbox {sample.outbox.rows:>9,} rows "
                    f"{sample.outbox.total_bytes / 2**20:7.1f} MiB "
                    f"({sample.outbox.dead_tuples:,} dead)  inbox {sample.inbox.rows:>9,} "
                    f"rows {sample.inbox.total_bytes / 2**20:7.1f} MiB  longest purge tx "
                    f"{longest:6.1f} ms  load {sample.load[0]:.1f}",
                    flush=True,
                )
        finally:
            stop.set()
            stop_writing.set()
            await asyncio.to_thread(writer.join, 60)
            await retention
            await lag
        result.seconds = time.monotonic() - began
        result.server = (await wal_stats(url)).since(wal_before)
        result.disk = disk_writes().since(disk_before, result.seconds)
        result.written = written.value
        result.consumed = await _applied(url)
    finally:
        if writer.is_alive():
            writer.terminate()
        for child in children:
            terminate(child)
    return result


def summary(result: InflowResult) -> dict[str, float]:
    """The figures of a run, for the report."""
    purges = result.outbox_purge_ms + result.inbox_purge_ms
    return {
        "write_per_s": result.write_rate,
        "consume_per_s": result.consume_rate,
        "outbox_purge_longest_ms": max(result.outbox_purge_ms, default=0.0),
        "inbox_purge_longest_ms": max(result.inbox_purge_ms, default=0.0),
        "purge_p99_ms": percentile(purges, 99),
        "purge_p50_ms": percentile(purges, 50),
        "outbox_lock_longest_ms": max(result.outbox_lock_ms, default=0.0),
        "outbox_lock_p99_ms": percentile(result.outbox_lock_ms, 99),
        "outbox_purge_p99_ms": percentile(result.outbox_purge_ms, 99),
        "outbox_vacuums": float(len(result.outbox_vacuum_ms)),
        "outbox_vacuum_longest_ms": max(result.outbox_vacuum_ms, default=0.0),
        "inbox_lock_longest_ms": max(result.inbox_lock_ms, default=0.0),
        "inbox_lock_p99_ms": percentile(result.inbox_lock_ms, 99),
        "loop_lag_p99_ms": percentile(result.loop_lag_ms, 99),
        "loop_lag_longest_ms": max(result.loop_lag_ms, default=0.0),
        "outbox_server_longest_ms": max(result.outbox_server_ms, default=0.0),
        "outbox_server_p99_ms": percentile(result.outbox_server_ms, 99),
        "outbox_block_rows_p50": percentile([float(n) for n in result.outbox_block_rows], 50),
        "outbox_block_rows_longest_held": float(
            max(
                zip(result.outbox_server_ms, result.outbox_block_rows, strict=True),
                default=(0.0, 0),
            )[1]
        ),
        "inbox_server_longest_ms": max(result.inbox_server_ms, default=0.0),
        "inbox_server_p99_ms": percentile(result.inbox_server_ms, 99),
        "lock_p99_ms": percentile(result.outbox_lock_ms + result.inbox_lock_ms, 99),
        "purge_transactions": float(len(purges)),
        "outbox_purged": float(result.outbox_purged),
        "inbox_purged": float(result.inbox_purged),
    }
