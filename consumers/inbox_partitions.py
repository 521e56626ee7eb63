"""The inbox's partitions on PostgreSQL: created ahead by the consumers, dropped whole when old.

``inbox_events`` is partitioned by range of ``id_ms``, the time in the event id
(:mod:`outboxkit.outbox.id_time`), so every delivery of an event finds its claim in one
partition. Its partitions (migration ``0016_inbox_partitions``):

- ``inbox_events_p<lower ms>``: one time range each, created ahead by :func:`ensure_ahead`;
- ``inbox_events_untimed``: ids that carry no time (``id_ms`` 0);
- ``inbox_events_default``: times no partition covers: events older than the oldest kept
  partition (a replay of an old event), or too far ahead (a skewed producer clock).

Retention (:func:`purge_partitioned`) drops a time partition when its range ended before the
shortest window; the claims in it that are still inside their own consumer's window (an old
event applied late, by a lagging consumer) move into the default partition under the same lock,
so **a claim is kept at least its consumer's window after it was made**, whichever partition it
is in. The untimed and default partitions, and ``inbox_events_unpartitioned`` (the inbox from
before partitions), lose their old claims by short chunked deletes.

A consumer's window is the one its retention last ran with (``inbox_windows``); a claim of a
consumer that runs no retention is kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from outboxkit.consumers.metrics import RETENTION_SKIPPED, RETENTION_SKIPPED_IN_A_ROW
from outboxkit.consumers.tables import inbox_windows
from outboxkit.outbox.dialects import POSTGRESQL
from outboxkit.outbox.dialects.base import BlockValue, Refusal
from outboxkit.outbox.locked import run_locked
from outboxkit.outbox.partitions import (
    LOCK_NOT_AVAILABLE,
    Busy,
    Dropped,
    KeepRows,
    Postponed,
    RangePartition,
    attach_range,
    drop_range,
    range_partitions,
)
from outboxkit.outbox.secrecy import sqlstate
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("outboxkit.consumer")

TABLE = "inbox_events"
UNTIMED = "inbox_events_untimed"
DEFAULT = "inbox_events_default"
UNPARTITIONED = "inbox_events_unpartitioned"
PREFIX = "inbox_events_p"
CHUNKED = (DEFAULT, UNTIMED, UNPARTITIONED)
"""The tables whose old claims go by chunked deletes, not by dropping a partition."""

MINUTE_MS = 60_000
DAY_MS = 86_400_000
LOCK_TIMEOUT_MS = 50
"""The longest a partition's attach or drop waits for its lock before giving up until the next
pass; writers that queue behind the waiting lock wait at most this long too."""
CHUNK = 1_000
"""Claims per transaction of the chunked deletes at most (fewer if the caller asks): about
30 ms of row locks at 5,000 claims/s on this project's 2 CPUs, where 5,000 held them 133 ms."""
KEEP_CAP = 10_000
"""A partition with more claims than this still inside their windows is not dropped yet."""
# An advisory lock key: one maintainer at a time among the consumers sharing the database.
# Taken for one transaction at a time only (pg_try_advisory_xact_lock), never for a session:
# through a transaction-mode pooler a session lock stays on whichever server connection took
# it, and its unlock may run on another.
_MAINTAINER_LOCK = 0x6F62_696E_626F_7870  # "obinboxp"
_OTHER_MAINTAINER = "OBX02"  # a step's block found the maintainer's lock held
_MAINTAINER_STEP = Refusal(f"NOT pg_try_advisory_xact_lock({_MAINTAINER_LOCK})", _OTHER_MAINTAINER)
"""The first step of each maintenance block: the maintainer's lock, for its transaction."""
OTHER_PASS = "another consumer's retention pass holds the inbox maintainer's lock"
SKIPS_WARNED = 5
"""Passes skipped in a row, by a consumer, after which a WARNING says so (and every as many
more)."""


def width_ms(window_ms: int) -> int:
    """The time range of a new partition for a consumer window: a seventh of it, within one
    minute and one day (a 7-day window: daily partitions, eight or nine of them)."""
    return max(MINUTE_MS, min(DAY_MS, window_ms // 7))


@dataclass
class Maintenance:
    """What one retention pass did: partitions ``created`` and ``dropped`` (with the claims they
    kept and the lock held), ``postponed`` ones, and claims ``deleted`` by chunks."""

    created: list[str] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    postponed: list[Postponed] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    """Partitions not attached or dropped this pass: a writer held the lock they needed
    longer than :data:`LOCK_TIMEOUT_MS`. The next pass tries again."""
    deleted: int = 0
    skipped: str | None = None
    """Why the pass stopped before its end (another consumer's pass was at work: it held the
    maintainer's lock); ``None`` when it ran to its end."""

    @property
    def removed(self) -> int:
        """Claims forgotten: deleted, or in a dropped partition and not kept."""
        return self.deleted + sum(d.rows - d.kept for d in self.dropped)


async def _now_ms_if_free(connection: AsyncConnection) -> int | None:
    """The database clock, if no other maintainer is in a step now (``None`` otherwise): the
    maintainer's lock taken and released in the same transaction."""
    free, now = (
        await connection.execute(
            select(func.pg_try_advisory_xact_lock(_MAINTAINER_LOCK), POSTGRESQL.now_ms())
        )
    ).one()
    await connection.commit()
    return int(now) if free else None


def _timed(partitions: list[RangePartition]) -> list[RangePartition]:
    return [
        p
        for p in partitions
        if not p.default and p.lower is not None and p.lower >= 1 and p.upper is not None
    ]


async def ensure_ahead(
    connection: AsyncConnection, *, width: int, ahead_ms: int, now_ms: int
) -> tuple[list[str], list[str]]:
    """Attach partitions of ``width`` ms after the newest one until ``now_ms + ahead_ms`` is
    covered; return their names, and the one that was busy (its lock not granted: the rest
    wait for the next pass). A range left behind (no consumer ran for a while) is not filled
    in: its claims are in the default partition."""
    timed = _timed(await range_partitions(connection, TABLE))
    await connection.commit()
    start = now_ms // width * width
    if timed:
        start = max(start, max(p.upper for p in timed if p.upper is not None))
    created: list[str] = []
    while start < now_ms + ahead_ms:
        name = f"{PREFIX}{start}"
        moved = await attach_range(
            connection,
            TABLE,
            name,
            key="id_ms",
            lower=start,
            upper=start + width,
            default=DEFAULT,
            lock_timeout_ms=LOCK_TIMEOUT_MS,
            refusals=(_MAINTAINER_STEP,),
        )
        if isinstance(moved, Busy):
            return created, [name]
        if moved:
            log.info("inbox partition %s took %d claims from the default partition", name, moved)
        created.append(name)
        start += width
    return created, []


async def _windows(connection: AsyncConnection) -> dict[str, int]:
    rows = await connection.execute(select(inbox_windows.c.consumer, inbox_windows.c.window_ms))
    return {consumer: window for consumer, window in rows}


# Of a partition's claims, those inside their consumer's window, read by index so a drop under
# the inbox's lock reads the claims it keeps, not the whole partition: those made since
# keep_floor (the longest window ago, a value the planner sees) along processed_ms, each
# checked against its consumer's window; and all the claims of a consumer without a window
# (its consumers found by a walk of the primary key, one probe each). The window: the one given,
# for every consumer or for keep_consumer; for another consumer the one it recorded.
_KEEP_INSIDE_WINDOWS = """WITH RECURSIVE present(consumer) AS (
 (SELECT consumer FROM {partition} ORDER BY consumer LIMIT 1)
 UNION ALL SELECT (SELECT t.consumer FROM {partition} t WHERE t.consumer > present.consumer
 ORDER BY t.consumer LIMIT 1) FROM present WHERE present.consumer IS NOT NULL
), windowed AS MATERIALIZED (
 SELECT present.consumer, {window} AS window_ms FROM present
 WHERE present.consumer IS NOT NULL
)
SELECT p.* FROM {partition} p JOIN windowed c ON c.consumer = p.consumer
 WHERE p.processed_ms >= keep_floor AND p.processed_ms >= keep_now - c.window_ms
UNION ALL
SELECT p.* FROM windowed c JOIN {partition} p ON p.consumer = c.consumer
 WHERE c.window_ms IS NULL"""
_RECORDED_WINDOW = (
    "CASE WHEN present.consumer = keep_consumer THEN keep_window ELSE (SELECT w.window_ms"
    " FROM inbox_windows w WHERE w.consumer = present.consumer) END"
)
# Another consumer recorded a window longer than the one keep_floor was read with: its claims
# older than keep_floor may be inside it. The drop waits for the next pass.
_WINDOW_GREW = (
    "(SELECT max(w.window_ms) FROM inbox_windows w"
    " WHERE w.consumer <> keep_consumer) > keep_now - keep_floor"
)


def _keep_inside_windows(
    consumer: str | None, window_ms: int, now_ms: int, *, longest_ms: int
) -> KeepRows:
    """The claims a dropped partition keeps: those inside their consumer's window, with
    ``consumer``'s (every consumer's, for ``None``) being ``window_ms`` and none longer than
    ``longest_ms`` (``window_ms`` or more)."""
    values: dict[str, BlockValue] = {
        "keep_now": int(now_ms),
        "keep_window": int(window_ms),
        "keep_floor": int(now_ms - longest_ms),
    }
    if consumer is None:
        return KeepRows(_KEEP_INSIDE_WINDOWS.replace("{window}", "keep_window"), values)
    values["keep_consumer"] = consumer
    return KeepRows(
        _KEEP_INSIDE_WINDOWS.replace("{window}", _RECORDED_WINDOW), values, (_WINDOW_GREW,)
    )


async def drop_expired(
    connection: AsyncConnection, *, horizon_ms: int, keep: KeepRows
) -> tuple[list[Dropped], list[Postponed], list[str]]:
    """Drop the time partitions whose range ended by ``horizon_ms`` (the shortest window ago),
    keeping their claims ``keep`` selects (moved to the default partition)."""
    partitions = _timed(await range_partitions(connection, TABLE))
    await connection.commit()
    dropped, postponed, busy = [], [], []
    for partition in partitions:
        if partition.upper is None or partition.upper > horizon_ms:
            break
        outcome = await drop_range(
            connection,
            TABLE,
            partition.name,
            keep=keep,
            keep_cap=KEEP_CAP,
            lock_timeout_ms=LOCK_TIMEOUT_MS,
            refusals=(_MAINTAINER_STEP,),
        )
        if isinstance(outcome, Dropped):
            dropped.append(outcome)
        elif isinstance(outcome, Postponed):
            postponed.append(outcome)
        else:
            busy.append(outcome.name)
    return dropped, postponed, busy


async def delete_old_claims(
    connection: AsyncConnection,
    table: str,
    *,
    consumer: str | None,
    cutoff_ms: int,
    chunk_size: int,
) -> int:
    """Delete ``table``'s claims (of ``consumer``, or all) made before ``cutoff_ms``, at most
    ``chunk_size`` per chunk; return how many went. Each chunk reads its keys along the
    ``processed_ms`` index and deletes them by primary key, in one locked block (one statement
    in autocommit: its row locks are released inside the server, and a lock it waits for
    longer than :data:`LOCK_TIMEOUT_MS` ends this table's deletes until the next pass)."""
    if table not in CHUNKED:
        raise ValueError(f"not a chunk-purged inbox table: {table}")
    # The block's variables (its values), so its text is the same for every pass.
    of_consumer = "" if consumer is None else " AND consumer = claims_consumer"
    statement = (
        f"WITH chosen AS (SELECT consumer, source, event_id FROM {table}"
        f" WHERE processed_ms < claims_cutoff{of_consumer} ORDER BY processed_ms"
        f" LIMIT claims_limit) DELETE FROM {table} t USING chosen"
        " WHERE t.consumer = chosen.consumer AND t.source = chosen.source"
        " AND t.event_id = chosen.event_id"
    )
    values: dict[str, int | str] = {"claims_cutoff": int(cutoff_ms), "claims_limit": chunk_size}
    if consumer is not None:
        values["claims_consumer"] = consumer
    block = POSTGRESQL.locked_block(
        [_MAINTAINER_STEP, statement],
        lock_timeout_ms=LOCK_TIMEOUT_MS,
        commit_without_flush=True,
        values=values,
    )
    assert block is not None  # PostgreSQL has them
    removed = 0
    while True:
        try:
            count = (await run_locked(connection, block)).rows
        except DBAPIError as error:
            if sqlstate(error) != LOCK_NOT_AVAILABLE:
                raise
            log.info("inbox claims of %s: a chunk's lock was not granted: next pass", table)
            return removed
        removed += count
        if count < chunk_size:
            return removed


async def record_window(connection: AsyncConnection, consumer: str, window_ms: int) -> None:
    """Store ``consumer``'s window (the one its retention runs with): one locked block, so
    the upsert's row lock is released inside the server (a lock not granted within
    :data:`LOCK_TIMEOUT_MS` leaves the stored window to the next pass)."""
    upsert = (
        "INSERT INTO inbox_windows (consumer, window_ms, seen_ms)"
        f" VALUES (window_of, window_length, {POSTGRESQL.now_ms_sql})"
        " ON CONFLICT (consumer) DO UPDATE"
        " SET window_ms = EXCLUDED.window_ms, seen_ms = EXCLUDED.seen_ms"
    )
    block = POSTGRESQL.locked_block(
        [upsert],
        lock_timeout_ms=LOCK_TIMEOUT_MS,
        commit_without_flush=True,  # lost in a crash: the window stored before stays
        values={"window_of": consumer, "window_length": int(window_ms)},
    )
    assert block is not None  # PostgreSQL has them
    try:
        await run_locked(connection, block)
    except DBAPIError as error:
        if sqlstate(error) != LOCK_NOT_AVAILABLE:
            raise
        log.info("inbox window of %s not stored: its row's lock was not granted", consumer)


async def purge_partitioned(
    engine: AsyncEngine,
    *,
    consumer: str | None,
    window_ms: int,
    chunk_size: int,
    ahead_ms: int | None = None,
) -> Maintenance:
    """One retention pass over the partitioned inbox: with ``ahead_ms``, first attach the
    partitions of the next ``ahead_ms`` (``consumer``'s window recorded, as a runtime's pass
    does); then drop expired partitions and delete old claims of the chunk-purged tables.

    ``consumer`` ``None``: every consumer's claims older than ``window_ms`` go. Only one
    maintainer at a time: each step's block takes the maintainer's advisory lock for its own
    transaction first, so no session state outlives a transaction (a transaction-mode pooler
    may run the next one on another server connection). A pass that finds the lock held, when
    it starts or at a step, stops there (``skipped`` says why; one log line), and a consumer's
    passes skipped :data:`SKIPS_WARNED` times in a row are a WARNING (and the
    ``outboxkit_inbox_retention_skipped`` metrics). Each step is whole: a pass stopped between
    two leaves nothing half done.
    """
    done = Maintenance()
    async with engine.connect() as connection:
        now = await _now_ms_if_free(connection)
        try:
            if now is None:
                done.skipped = OTHER_PASS
            else:
                await _maintain(connection, done, consumer, window_ms, chunk_size, ahead_ms, now)
        except DBAPIError as error:
            if sqlstate(error) != _OTHER_MAINTAINER:
                raise
            await connection.rollback()
            done.skipped = OTHER_PASS
    _count_skip(consumer, done)
    return done


async def _maintain(
    connection: AsyncConnection,
    done: Maintenance,
    consumer: str | None,
    window_ms: int,
    chunk_size: int,
    ahead_ms: int | None,
    now: int,
) -> None:
    """The steps of a pass that found the maintainer's lock free at ``now``."""
    if consumer is not None and ahead_ms is not None:
        await record_window(connection, consumer, window_ms)
    if ahead_ms is not None:
        done.created, done.busy = await ensure_ahead(
            connection, width=width_ms(window_ms), ahead_ms=ahead_ms, now_ms=now
        )
    recorded = [] if consumer is None else list((await _windows(connection)).values())
    await connection.commit()
    keep = _keep_inside_windows(consumer, window_ms, now, longest_ms=max([window_ms, *recorded]))
    done.dropped, done.postponed, busy = await drop_expired(
        connection, horizon_ms=now - min([window_ms, *recorded]), keep=keep
    )
    done.busy += busy
    for name in done.busy:
        log.info(
            "inbox partition %s busy (its lock was not granted, or another pass got to it"
            " first): next pass",
            name,
        )
    for postponed in done.postponed:
        log.info(
            "inbox partition %s kept: over %d claims still inside their windows",
            postponed.name,
            KEEP_CAP,
        )
    for table in CHUNKED:
        done.deleted += await delete_old_claims(
            connection,
            table,
            consumer=consumer,
            cutoff_ms=now - window_ms,
            chunk_size=min(chunk_size, CHUNK),
        )


_skipped_in_a_row: dict[str, int] = {}


def _count_skip(consumer: str | None, done: Maintenance) -> None:
    """Log a skipped pass (one line), count it, and WARN at every :data:`SKIPS_WARNED` in a
    row; a pass that ran to its end starts the count again."""
    name = consumer or "*"
    if done.skipped is None:
        if _skipped_in_a_row.pop(name, 0) >= SKIPS_WARNED:
            log.info("inbox retention of %s ran again after skipped passes", name)
        RETENTION_SKIPPED_IN_A_ROW.labels(name).set(0)
        return
    streak = _skipped_in_a_row.get(name, 0) + 1
    _skipped_in_a_row[name] = streak
    RETENTION_SKIPPED.labels(name).inc()
    RETENTION_SKIPPED_IN_A_ROW.labels(name).set(streak)
    if streak % SKIPS_WARNED == 0:
        log.warning(
            "inbox retention of %s skipped %d passes in a row: %s (claims are not forgotten"
            " meanwhile; a pass stuck elsewhere, or a session lock a pooler kept, would do this)",
            name,
            streak,
            done.skipped,
        )
    else:
        log.info("inbox retention pass of %s skipped: %s", name, done.skipped)
