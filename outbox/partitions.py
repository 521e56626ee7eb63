"""Range partitions on PostgreSQL: list them, attach new ones ahead of the writers, and drop old
ones whole, keeping the rows a caller still needs.

Only for a database whose dialect has ``time_partitions`` (PostgreSQL). The statements are
chosen for their locks, since writers run beside them:

- **attach** builds the partition as a plain table with its indexes and ``ATTACH``es it: a
  ``SHARE UPDATE EXCLUSIVE`` lock on the parent, which writers do not wait for (``CREATE TABLE
  ... PARTITION OF`` would take ``ACCESS EXCLUSIVE``), and ``ACCESS EXCLUSIVE`` on the
  ``DEFAULT`` partition while it checks that none of its rows is in the new range. Rows it
  holds there move into the new partition first, under the same lock: the lock, the move and
  the attach are one statement in autocommit (:mod:`outboxkit.outbox.locked`), committed
  inside the server with no client round trip while the lock is held;
- **drop** takes the parent's ``ACCESS EXCLUSIVE`` lock (under a short ``lock_timeout``),
  counts the rows to keep, detaches the partition and moves those rows back into the parent
  (the ``DEFAULT`` partition catches them, their range being gone): one locked block, so the
  lock is held for the server's work only; the ``DROP TABLE`` after it locks only the detached
  table. ``DETACH ... CONCURRENTLY`` would not block writers at all but cannot run inside a
  transaction, so a row written between the count and the detach could be lost; the plain
  detach under the lock is what keeps it exact. The lock is held for the count, the detach and
  the move: milliseconds for few rows to keep (measured in ``bench.growth``'s inflow run).

Both commit without waiting for their log to reach the disk, so no lock is held through a
flush a checkpoint's writes may stall: after a crash that lost one, the table is as it was
before it (the move and the attach or detach are one transaction), and a transaction that
wrote into a partition it attached is later in the log, so its commit flushes the attach.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.dialects.base import BlockValue, Refusal
from outboxkit.outbox.locked import run_locked
from outboxkit.outbox.secrecy import sqlstate
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True, slots=True)
class KeepRows:
    """Which rows of a partition a drop keeps: a query of them, all columns in the table's order,
    naming the partition ``{partition}`` (run under the parent's lock, twice: counted, then
    moved), and the locked block's values it names as variables
    (:meth:`~outboxkit.outbox.dialects.Dialect.block_value`)."""

    query: str
    values: Mapping[str, BlockValue] = field(default_factory=dict)
    not_now: tuple[str, ...] = ()
    """Conditions (SQL, on the same values) under which the drop waits for a later pass: the
    query would not select every row to keep (a window read before the lock has grown since,
    say)."""


LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE when lock_timeout expires
_POSTPONED = "OBX01"  # raised by a drop's block with more rows to keep than its cap
_ATTACHED = "OBX03"  # raised by an attach's block finding the partition attached already
_UNDEFINED_TABLE = "42P01"
_BOUND = re.compile(r"FOR VALUES FROM \((.+?)\) TO \((.+?)\)")
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True, slots=True)
class RangePartition:
    """One partition of a range-partitioned table: ``lower <= key < upper``; ``None`` for
    ``MINVALUE``/``MAXVALUE``; ``default`` for the ``DEFAULT`` partition (no bounds)."""

    name: str
    lower: int | None
    upper: int | None
    default: bool = False


@dataclass(frozen=True, slots=True)
class Dropped:
    """A partition dropped: of its ``rows`` (counted before the lock), ``kept`` moved back into
    the parent; its locked block's round trip, the longest the parent's exclusive lock can
    have been held (its wait included), was ``held_ms``, of which ``server_ms`` in the server."""

    name: str
    rows: int
    kept: int
    held_ms: float
    server_ms: float


@dataclass(frozen=True, slots=True)
class Busy:
    """A partition not attached or dropped: its lock was not granted within the lock timeout
    (a writer's transaction held a conflicting one); nothing changed."""

    name: str


@dataclass(frozen=True, slots=True)
class Postponed:
    """A partition not dropped: it still holds more than the cap of rows to keep, or one of
    its :attr:`KeepRows.not_now` conditions held."""

    name: str


def _identifier(name: str) -> str:
    """``name`` checked as a plain lower-case identifier, since DDL cannot bind names."""
    if _NAME.fullmatch(name) is None:
        raise ValueError(f"not a plain identifier: {name!r}")
    return name


def _bound(text_value: str) -> int | None:
    value = text_value.strip().strip("'")
    return None if value in ("MINVALUE", "MAXVALUE") else int(value)


async def range_partitions(connection: AsyncConnection, table: str) -> list[RangePartition]:
    """The partitions of ``table`` (in the search path), lowest range first, the default last."""
    rows = await connection.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(:table)"
        ),
        {"table": _identifier(table)},
    )
    partitions = []
    for name, bound in rows:
        if bound == "DEFAULT":
            partitions.append(RangePartition(name, None, None, default=True))
            continue
        match = _BOUND.fullmatch(bound)
        if match is None:
            raise ValueError(f"{name}: not a single-column range partition ({bound})")
        partitions.append(RangePartition(name, _bound(match[1]), _bound(match[2])))

    def order(partition: RangePartition) -> tuple[int, int]:
        if partition.default:
            return (2, 0)
        return (0, -(2**63)) if partition.lower is None else (1, partition.lower)

    return sorted(partitions, key=order)


async def attach_range(
    connection: AsyncConnection,
    table: str,
    name: str,
    *,
    key: str,
    lower: int,
    upper: int,
    default: str | None,
    lock_timeout_ms: int,
    refusals: tuple[Refusal, ...] = (),
) -> int | Busy:
    """Create ``name`` for ``lower <= key < upper`` and attach it to ``table``; return how many
    rows it took over from the ``default`` partition (usually none: rows written for a range
    before its partition existed), 0 when ``name`` is attached already (another maintainer's
    pass did it), or :class:`Busy` when a lock was not granted within ``lock_timeout_ms``
    (nothing changed). ``connection`` is outside a transaction.

    One locked block (:mod:`outboxkit.outbox.locked`), so no maintainer ever leaves a table
    built and not attached: ``refusals`` first (the caller's, e.g. a maintainer's lock for the
    block's transaction), then a table of that name left unattached (by a crash of a release
    that built it in a transaction of its own) is dropped, the table and its range ``CHECK``
    (the same as its bound) are built, locking nothing writers use; then the default
    partition's writers are locked out, the rows of the range it holds (if any) move and the
    partition attaches, finding the indexes built and the range checked; it commits, all inside
    the server with no client round trip while the locks are held."""
    parent, child, column = _identifier(table), _identifier(name), _identifier(key)
    in_range = f"{column} >= {int(lower)} AND {column} < {int(upper)}"
    statements: list[str | Refusal] = [
        *refusals,
        Refusal(
            f"EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass('{child}'))", _ATTACHED
        ),
        f"DROP TABLE IF EXISTS {child}",
        f"CREATE TABLE {child} (LIKE {parent} INCLUDING ALL)",
        f"ALTER TABLE {child} ADD CONSTRAINT {child}_range CHECK ({in_range})",
    ]
    if default is not None:
        held = _identifier(default)
        # Writers of the default partition wait from here: none may add a row of the range
        # between the move and the attach (which would then fail).
        statements += [
            f"LOCK TABLE {held} IN EXCLUSIVE MODE",
            f"WITH moved AS (DELETE FROM {held} WHERE {in_range} RETURNING *) "
            f"INSERT INTO {child} SELECT * FROM moved",
        ]
    statements.append(
        f"ALTER TABLE {parent} ATTACH PARTITION {child} "
        f"FOR VALUES FROM ({int(lower)}) TO ({int(upper)})"
    )
    block = dialect_of(connection).locked_block(
        statements, lock_timeout_ms=lock_timeout_ms, commit_without_flush=True
    )
    if block is None:
        raise ValueError("range partitions need a database with locked blocks")
    try:
        return (await run_locked(connection, block)).rows
    except DBAPIError as error:
        if sqlstate(error) == LOCK_NOT_AVAILABLE:
            return Busy(name)
        if sqlstate(error) == _ATTACHED:
            return 0
        raise


async def drop_range(
    connection: AsyncConnection,
    table: str,
    name: str,
    *,
    keep: KeepRows,
    keep_cap: int,
    lock_timeout_ms: int,
    refusals: tuple[Refusal, ...] = (),
) -> Dropped | Postponed | Busy:
    """Detach ``name`` from ``table`` and drop it, keeping the rows ``keep`` selects: they move
    back into ``table`` in the same transaction, under the parent's exclusive lock, so no reader
    misses them and no writer adds a row to the partition after they were chosen. More than
    ``keep_cap`` of them, or one of ``keep.not_now`` true: nothing changes
    (:class:`Postponed`); the lock not granted within
    ``lock_timeout_ms``, or the partition detached or dropped by another maintainer's pass
    meanwhile: nothing changes either (:class:`Busy`). ``refusals`` (the caller's) come first
    in the block. ``connection`` is outside a transaction.

    The lock, the count of the rows to keep, the detach and their move are one locked block
    (:mod:`outboxkit.outbox.locked`), committed inside the server with no client round trip
    while the lock is held; the ``DROP TABLE`` after it locks only the detached table."""
    parent, child = _identifier(table), _identifier(name)
    try:
        async with connection.begin():
            rows = (await connection.execute(text(f"SELECT count(*) FROM {child}"))).scalar_one()
    except DBAPIError as error:
        if sqlstate(error) == _UNDEFINED_TABLE:  # dropped by another maintainer's pass
            return Busy(name)
        raise
    kept = keep.query.replace("{partition}", child)
    cap = int(keep_cap)
    statements: list[str | Refusal] = [
        *refusals,
        f"LOCK TABLE {parent} IN ACCESS EXCLUSIVE MODE",
        Refusal(
            f"NOT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass('{child}')"
            f" AND inhparent = to_regclass('{parent}'))",
            LOCK_NOT_AVAILABLE,
        ),
        *(Refusal(condition, _POSTPONED) for condition in keep.not_now),
        Refusal(f"(SELECT count(*) FROM ({kept} LIMIT {cap + 1}) k) > {cap}", _POSTPONED),
        f"ALTER TABLE {parent} DETACH PARTITION {child}",
        f"INSERT INTO {parent} {kept}",
    ]
    block = dialect_of(connection).locked_block(
        statements, lock_timeout_ms=lock_timeout_ms, commit_without_flush=True, values=keep.values
    )
    if block is None:
        raise ValueError("range partitions need a database with locked blocks")
    try:
        held = await run_locked(connection, block)
    except DBAPIError as error:
        if sqlstate(error) == LOCK_NOT_AVAILABLE:
            return Busy(name)
        if sqlstate(error) == _POSTPONED:
            return Postponed(name)
        raise
    async with connection.begin():
        await connection.execute(text(f"DROP TABLE {child}"))
    return Dropped(name, rows, held.rows, held_ms=held.round_trip_ms, server_ms=held.server_ms)
