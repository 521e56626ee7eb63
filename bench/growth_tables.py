"""Set-up and inspection for bench.growth: big tables filled with COPY, their sizes and bloat
(``pgstattuple``), and the duration of every transaction a retention engine runs."""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from outboxkit.consumers.inbox_partitions import DAY_MS
from outboxkit.outbox import locked
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.partitions import attach_range, range_partitions
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

COPY_CHUNK = 100_000
# Realistic inbox keys: a few consumers, a few dozen producing services, UUIDv7 event ids.
CONSUMERS = ("billing", "shipping", "ledger", "notify")
SOURCES = tuple(f"//orders.example.com/svc-{n}" for n in range(24))
WEEK_MS = 7 * 24 * 3600 * 1000


def asyncpg_dsn(url: str) -> str:
    """``url`` (any SQLAlchemy PostgreSQL URL) as a DSN asyncpg accepts."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def uuid7_at(ms: int) -> str:
    """A UUIDv7 string whose embedded time is ``ms`` (epoch milliseconds)."""
    rand = int.from_bytes(os.urandom(10), "big")
    a = (rand >> 62) & 0xFFF
    b = (rand & ((1 << 62) - 1)) | (1 << 63)  # variant 10
    value = (ms << 80) | (0x7 << 76) | (a << 64) | b
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def inbox_rows(count: int, first_ms: int, last_ms: int) -> Iterator[list[tuple[Any, ...]]]:
    """``count`` inbox rows in chunks, ``processed_ms`` rising evenly from ``first_ms`` to
    ``last_ms``, each event id a UUIDv7 of (about) that time, keys spread over
    :data:`CONSUMERS` x :data:`SOURCES`."""
    step = (last_ms - first_ms) / max(1, count)
    pick = random.Random(27)
    for start in range(0, count, COPY_CHUNK):
        chunk = []
        for n in range(start, min(count, start + COPY_CHUNK)):
            ms = first_ms + int(n * step)
            chunk.append(
                (
                    pick.choice(CONSUMERS),
                    pick.choice(SOURCES),
                    uuid7_at(id_ms := ms - pick.randrange(50)),
                    ms,
                    id_ms,
                )
            )
        yield chunk


async def attach_days(url: str, first_ms: int, last_ms: int) -> int:
    """The inbox's daily partitions from ``first_ms``'s day to ``last_ms``'s, those missing (a
    consumer's retention would have attached them as the days came); how many were attached."""
    engine = make_async_engine(url)
    attached = 0
    try:
        async with engine.connect() as connection:
            there = {p.lower for p in await range_partitions(connection, "inbox_events")}
            await connection.commit()
            for day in range(first_ms // DAY_MS * DAY_MS, last_ms + 1, DAY_MS):
                if day in there:
                    continue
                await attach_range(
                    connection,
                    "inbox_events",
                    f"inbox_events_p{day}",
                    key="id_ms",
                    lower=day,
                    upper=day + DAY_MS,
                    default="inbox_events_default",
                    lock_timeout_ms=60_000,
                )
                attached += 1
    finally:
        await engine.dispose()
    return attached


async def copy_inbox(url: str, count: int, first_ms: int, last_ms: int) -> float:
    """COPY ``count`` inbox rows into ``inbox_events`` (into the daily partitions of their ids'
    times, attached first); seconds it took."""
    began = time.monotonic()
    await attach_days(url, first_ms, last_ms + DAY_MS)
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        columns = ["consumer", "source", "event_id", "processed_ms", "id_ms"]
        for chunk in inbox_rows(count, first_ms, last_ms):
            await connection.copy_records_to_table("inbox_events", records=chunk, columns=columns)
    finally:
        await connection.close()
    return time.monotonic() - began


OUTBOX_COLUMNS = [
    "source",
    "event_id",
    "type",
    "topic",
    "kafka_key",
    "shard",
    "headers",
    "payload",
    "created_ms",
    "available_ms",
    "attempts",
    "last_error",
    "published_ms",
    "parked_ms",
    "deliver_at_ms",
]


async def copy_outbox(
    url: str,
    count: int,
    first_ms: int,
    last_ms: int,
    *,
    state: str,
    payload_bytes: int,
    shards: int = 64,
) -> float:
    """COPY ``count`` outbox rows of ``state`` (``published``, ``parked`` or ``scheduled``)
    created from ``first_ms`` to ``last_ms``; seconds it took."""
    began = time.monotonic()
    payload = b'{"fill":"' + b"x" * max(0, payload_bytes - 11) + b'"}'
    headers = '{"ce_specversion":"1.0","ce_type":"order.placed","content-type":"application/json"}'
    step = (last_ms - first_ms) / max(1, count)
    tag = os.urandom(3).hex()  # fills of the same database do not collide on (source, id)
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        for start in range(0, count, COPY_CHUNK):
            chunk = []
            for n in range(start, min(count, start + COPY_CHUNK)):
                ms = first_ms + int(n * step)
                published = ms + 5 if state == "published" else None
                parked = ms + 5 if state == "parked" else None
                due = last_ms + 86_400_000 + n if state == "scheduled" else None
                error = "broker refused: message too large" if state == "parked" else None
                chunk.append(
                    (
                        SOURCES[n % len(SOURCES)],
                        f"{tag}-{uuid7_at(ms)}",
                        "order.placed",
                        "orders",
                        f"k{n % 1000}".encode(),
                        n % shards,
                        headers,
                        payload,
                        ms,
                        ms,
                        1 if published else 0,
                        error,
                        published,
                        parked,
                        due,
                    )
                )
            await connection.copy_records_to_table(
                "outbox_events", records=chunk, columns=OUTBOX_COLUMNS
            )
    finally:
        await connection.close()
    return time.monotonic() - began


async def vacuum_analyze(url: str, table: str) -> float:
    """``VACUUM (ANALYZE)`` ``table`` as autovacuum eventually would (set-up); seconds."""
    began = time.monotonic()
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await connection.execute(f"VACUUM (ANALYZE) {table}")
    finally:
        await connection.close()
    return time.monotonic() - began


WAL_SETTINGS = ("max_wal_size", "checkpoint_timeout", "wal_compression", "shared_buffers")
"""The server's settings that decide how often a page is logged whole (after each checkpoint)."""


@dataclass
class WalStats:
    """The server's WAL settings, and its checkpoints, WAL bytes and full-page images so far
    (cumulative: subtract two readings for a run's)."""

    settings: dict[str, str]
    checkpoints_timed: int
    checkpoints_requested: int
    wal_bytes: int
    full_page_images: int

    def since(self, earlier: WalStats) -> str:
        """What the server did between ``earlier`` and this reading, and its settings."""
        wal_mib = (self.wal_bytes - earlier.wal_bytes) / 2**20
        settings = ", ".join(f"{name} {value}" for name, value in self.settings.items())
        return (
            f"{self.checkpoints_timed - earlier.checkpoints_timed} timed and "
            f"{self.checkpoints_requested - earlier.checkpoints_requested} requested "
            f"checkpoints, {wal_mib:,.0f} MiB of WAL, "
            f"{self.full_page_images - earlier.full_page_images:,} full-page images "
            f"({settings})"
        )


async def wal_stats(url: str) -> WalStats:
    """The server's :class:`WalStats` now (``pg_stat_checkpointer`` from PostgreSQL 17,
    ``pg_stat_bgwriter`` before)."""
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        settings = {
            name: await connection.fetchval(f"SHOW {name}")  # names from WAL_SETTINGS only
            for name in WAL_SETTINGS
        }
        if await connection.fetchval("SELECT to_regclass('pg_stat_checkpointer') IS NOT NULL"):
            checkpoints = await connection.fetchrow(
                "SELECT num_timed AS timed, num_requested AS requested FROM pg_stat_checkpointer"
            )
        else:
            checkpoints = await connection.fetchrow(
                "SELECT checkpoints_timed AS timed, checkpoints_req AS requested"
                " FROM pg_stat_bgwriter"
            )
        wal = await connection.fetchrow("SELECT wal_bytes, wal_fpi FROM pg_stat_wal")
    finally:
        await connection.close()
    return WalStats(
        settings=settings,
        checkpoints_timed=int(checkpoints["timed"]),
        checkpoints_requested=int(checkpoints["requested"]),
        wal_bytes=int(wal["wal_bytes"]),
        full_page_images=int(wal["wal_fpi"]),
    )


@dataclass(frozen=True)
class DiskWrites:
    """Writes completed and sectors written so far by this machine's disks (``/sys/block``,
    loop and RAM devices aside): the whole machine's, the broker's and the bench's included."""

    ios: int
    bytes: int

    def since(self, earlier: DiskWrites, seconds: float) -> str:
        """The writes between ``earlier`` and this reading, in total and per second."""
        ios, written = self.ios - earlier.ios, self.bytes - earlier.bytes
        return (
            f"{ios:,} write IOs ({ios / seconds:,.0f}/s), {written / 2**20:,.0f} MiB "
            f"({written / 2**20 / seconds:,.1f} MiB/s)"
        )


def disk_writes() -> DiskWrites:
    """This machine's :class:`DiskWrites` now (zeros where ``/sys/block`` is missing)."""
    ios = sectors = 0
    root = Path("/sys/block")
    for device in sorted(root.iterdir()) if root.is_dir() else []:
        if device.name.startswith(("loop", "ram", "zram")):
            continue
        fields = (device / "stat").read_text().split()
        ios, sectors = ios + int(fields[4]), sectors + int(fields[6])
    return DiskWrites(ios, sectors * 512)  # the kernel counts 512-byte sectors


@dataclass
class TableStats:
    """Size and bloat of one table, as ``pgstattuple`` and the statistics views see it."""

    table: str
    rows: int
    heap_bytes: int
    index_bytes: int
    dead_tuples: int
    dead_percent: float
    free_percent: float
    pkey_leaf_density: float

    @property
    def total_bytes(self) -> int:
        """Heap plus indexes (and TOAST)."""
        return self.heap_bytes + self.index_bytes

    def bytes_per_row(self) -> float:
        """Total bytes per live row (0 for an empty table)."""
        return self.total_bytes / self.rows if self.rows else 0.0


async def table_stats(url: str, table: str) -> TableStats:
    """Live rows, heap and index bytes, dead tuples and free space (``pgstattuple_approx``),
    and the primary key's leaf density (``pgstatindex``: below ~90 % is bloat). A partitioned
    table: the sums over its partitions (percentages and density weighted by their sizes)."""
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await connection.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        leaves = await connection.fetch(
            "SELECT relid::regclass::text AS name FROM pg_partition_tree($1::regclass) "
            "WHERE isleaf",
            table,
        )
        parts = [await _leaf_stats(connection, row["name"]) for row in leaves] or [
            await _leaf_stats(connection, table)
        ]
    finally:
        await connection.close()
    heap = sum(p.heap_bytes for p in parts)
    weight = max(1, heap)
    dense = [p for p in parts if not math.isnan(p.pkey_leaf_density)]  # NaN: an empty index
    return TableStats(
        table=table,
        rows=sum(p.rows for p in parts),
        heap_bytes=heap,
        index_bytes=sum(p.index_bytes for p in parts),
        dead_tuples=sum(p.dead_tuples for p in parts),
        dead_percent=sum(p.dead_percent * p.heap_bytes for p in parts) / weight,
        free_percent=sum(p.free_percent * p.heap_bytes for p in parts) / weight,
        pkey_leaf_density=sum(p.pkey_leaf_density * p.index_bytes for p in dense)
        / max(1, sum(p.index_bytes for p in dense)),
    )


async def _leaf_stats(connection: asyncpg.Connection, table: str) -> TableStats:
    """:func:`table_stats` of one plain table."""
    approx = await connection.fetchrow("SELECT * FROM pgstattuple_approx($1::regclass)", table)
    sizes = await connection.fetchrow(
        "SELECT pg_table_size($1::regclass) AS heap, pg_indexes_size($1::regclass) AS idx",
        table,
    )
    pkey = await connection.fetchval(
        "SELECT indexrelid::regclass::text FROM pg_index "
        "WHERE indrelid = $1::regclass AND indisprimary",
        table,
    )
    density = None
    if pkey is not None:
        density = await connection.fetchval(
            "SELECT avg_leaf_density FROM pgstatindex($1::regclass)", pkey
        )
    return TableStats(
        table=table,
        rows=int(approx["approx_tuple_count"]),
        heap_bytes=int(sizes["heap"]),
        index_bytes=int(sizes["idx"]),
        dead_tuples=int(approx["dead_tuple_count"]),
        dead_percent=float(approx["dead_tuple_percent"]),
        free_percent=float(approx["approx_free_percent"]),
        pkey_leaf_density=float(density or 0.0),
    )


_LOCKING = re.compile(r"\b(DELETE|UPDATE|INSERT|LOCK|ALTER|DROP)\b", re.IGNORECASE)
_AUTOCOMMIT = "AUTOCOMMIT"


def _takes_row_locks(statement: str) -> bool:
    """True for a statement that takes locks writers can wait for until the transaction ends:
    it writes rows (a CTE's ``DELETE`` too), locks them (``FOR UPDATE``) or a table (``LOCK``,
    ``ALTER TABLE ... ATTACH/DETACH``, ``DROP``); a ``DO`` block holding such a statement."""
    return _LOCKING.search(statement) is not None


def _head(statement: str) -> str:
    """What names a lock hold: a statement's first 60 characters; a ``DO`` block's first
    locking statement (its settings come first), marked ``DO:``."""
    flat = " ".join(statement.split())
    block = flat.find("DO $")  # a locked block's values come before it in its message
    if flat[:3].upper() == "DO " or block > 0:
        flat = flat[max(block, 0) :]
        found = _LOCKING.search(flat)
        return "DO: " + flat[found.start() if found else 0 :].split(";")[0][:56]
    return flat[:60]


def _autocommit(connection: Any) -> bool:
    return connection.get_execution_options().get("isolation_level") == _AUTOCOMMIT


@dataclass
class TransactionTimer:
    """Wall time of every transaction of an engine, from BEGIN to COMMIT/ROLLBACK returning,
    and how long it held locks: from its first statement that writes or locks (rows or a
    table) to the end (the share locks of a plain SELECT block only DDL and are not counted).

    On a connection in autocommit each statement is a transaction of its own (SQLAlchemy's
    ``begin`` and ``commit`` there send nothing): it is timed from being sent to its result
    returning, and a locking one (a locked ``DO`` block) counts as a lock hold for that whole
    round trip, an upper bound of the hold inside the server."""

    durations_ms: list[float] = field(default_factory=list)
    locks_ms: list[float] = field(default_factory=list)
    lock_statements: list[str] = field(default_factory=list)
    """The statement each lock hold of ``locks_ms`` began with (its first 60 characters)."""
    _began: dict[int, float] = field(default_factory=dict)
    _locked: dict[int, tuple[float, str]] = field(default_factory=dict)
    _sent: dict[int, tuple[float, str]] = field(default_factory=dict)

    def attach(self, engine: AsyncEngine) -> AsyncEngine:
        """Time ``engine``'s transactions from now on; return it."""

        def begin(connection: Any) -> None:
            if not _autocommit(connection):
                self._began[id(connection)] = time.perf_counter()

        def execute(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
            if _autocommit(connection):
                self._sent[id(connection)] = (time.perf_counter(), statement)
            elif id(connection) in self._began and _takes_row_locks(statement):
                self._locked.setdefault(id(connection), (time.perf_counter(), _head(statement)))

        def executed(connection: Any, *args: Any) -> None:
            sent = self._sent.pop(id(connection), None)
            if sent is not None:
                self._record(sent[0], sent[1])

        def failed(context: Any) -> None:
            if context.connection is not None:
                executed(context.connection)

        def end(connection: Any) -> None:
            now = time.perf_counter()
            began = self._began.pop(id(connection), None)
            if began is not None:
                self.durations_ms.append((now - began) * 1000)
            locked = self._locked.pop(id(connection), None)
            if locked is not None:
                self.locks_ms.append((now - locked[0]) * 1000)
                self.lock_statements.append(locked[1])

        # A locked block goes to the driver as one message, which SQLAlchemy's events do not
        # see: its round trip is timed around outboxkit.outbox.locked's send_script.
        sent_alone = locked.send_script

        async def timed_script(
            connection: AsyncConnection, script: str, *, notices: list[str] | None = None
        ) -> str:
            if connection.sync_engine is not engine.sync_engine:
                return await sent_alone(connection, script, notices=notices)
            sent = time.perf_counter()
            try:
                return await sent_alone(connection, script, notices=notices)
            finally:
                self._record(sent, script)

        locked.send_script = timed_script
        event.listen(engine.sync_engine, "begin", begin)
        event.listen(engine.sync_engine, "before_cursor_execute", execute)
        event.listen(engine.sync_engine, "after_cursor_execute", executed)
        event.listen(engine.sync_engine, "handle_error", failed)
        event.listen(engine.sync_engine, "commit", end)
        event.listen(engine.sync_engine, "rollback", end)
        return engine

    def _record(self, sent: float, statement: str) -> None:
        """One statement in autocommit, sent at ``sent``, has returned (or failed)."""
        took_ms = (time.perf_counter() - sent) * 1000
        self.durations_ms.append(took_ms)
        if _takes_row_locks(statement):
            self.locks_ms.append(took_ms)
            self.lock_statements.append(_head(statement))

    @property
    def longest_ms(self) -> float:
        """The longest transaction so far (0 if none)."""
        return max(self.durations_ms, default=0.0)

    @property
    def longest_lock_ms(self) -> float:
        """The longest row-lock hold so far (0 if none)."""
        return max(self.locks_ms, default=0.0)

    def take(self) -> tuple[list[float], list[float]]:
        """The transaction and lock durations recorded so far; the timer starts afresh (the
        statements of the lock holds are kept, in :attr:`lock_statements`, with
        :attr:`all_locks_ms`)."""
        taken = (self.durations_ms, self.locks_ms)
        self.all_locks_ms += self.locks_ms
        self.durations_ms, self.locks_ms = [], []
        return taken

    all_locks_ms: list[float] = field(default_factory=list)

    def longest_holds(self, count: int) -> list[tuple[float, str]]:
        """The ``count`` longest lock holds so far, with the statement each began with."""
        holds = zip(self.all_locks_ms + self.locks_ms, self.lock_statements, strict=True)
        return sorted(holds, reverse=True)[:count]


def timed_engine(url: str) -> tuple[AsyncEngine, TransactionTimer]:
    """An engine for retention work whose transactions are timed."""
    timer = TransactionTimer()
    return timer.attach(make_async_engine(url)), timer


def run(coroutine: Any) -> Any:
    """``asyncio.run`` (short name for the many set-up steps)."""
    return asyncio.run(coroutine)
