"""Discarding dead letters: set aside, with a reason, without destroying them.

A Kafka record cannot be deleted, so a discard is a row of ``dlq_discards`` keyed by the
record's place ``(dlq topic, partition, offset)``, like the replay ledger. A discarded letter
stays in its topic and can still be shown; listings leave it out unless asked to include it,
and a replay skips it (status ``discarded``) until it is un-discarded explicitly
(:func:`discard` with ``undo``), which deletes the row. ``outboxkit dlq discard`` /
``undiscard`` and the console both go through :func:`discard`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from outboxkit.ops.access import OpsError
from outboxkit.ops.dlq.reader import DlqFilter, DlqReader, DlqRecord
from outboxkit.ops.dlq.tables import REASON_MAX, REPLAYED_BY_MAX, dlq_discards, held_by
from outboxkit.outbox.clock import db_now_ms
from outboxkit.outbox.dialects import dialect_insert
from outboxkit.outbox.jsonable import as_json
from sqlalchemy import delete, func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from uuid_utils import uuid7

CHUNK = 200
MAX_LISTED = 1000

Key = tuple[int, int]
"""A dead letter's ``(partition, offset)`` in its topic."""
DiscardStatus = Literal[
    "discarded", "would discard", "already discarded", "restored", "would restore", "not discarded"
]


@dataclass(frozen=True)
class DiscardOptions:
    """Who discards (or with ``undo`` un-discards) and why; ``dry_run`` only counts (and is the
    only run that may go without a reason)."""

    by: str
    reason: str
    dry_run: bool = False
    undo: bool = False

    def __post_init__(self) -> None:
        if not self.by.strip() or len(self.by) > REPLAYED_BY_MAX:
            raise OpsError(f"--by must have 1 to {REPLAYED_BY_MAX} characters")
        if len(self.reason) > REASON_MAX or not (self.dry_run or self.reason.strip()):
            raise OpsError(f"--reason is required: 1 to {REASON_MAX} characters")


@dataclass(frozen=True, slots=True)
class DiscardItem:
    """What happened to one matching dead letter."""

    partition: int
    offset: int
    type: str | None
    id: str | None
    status: DiscardStatus


@dataclass
class DiscardSummary:
    """The outcome of one discard (or un-discard) run, or of its dry run."""

    discard_id: str
    dlq_topic: str
    by: str
    reason: str
    dry_run: bool
    undo: bool
    matched: int = 0
    changed: int = 0
    """Discarded (restored with ``undo``), or would be on a dry run."""
    unchanged: int = 0
    """Already discarded (with ``undo``: not discarded)."""
    items: list[DiscardItem] = field(default_factory=list)
    more_items: int = 0

    def add(self, item: DiscardItem) -> None:
        """Count ``item`` and keep it for the listing (up to :data:`MAX_LISTED`)."""
        if item.status in ("already discarded", "not discarded"):
            self.unchanged += 1
        else:
            self.changed += 1
        if len(self.items) < MAX_LISTED:
            self.items.append(item)
        else:
            self.more_items += 1

    def to_json(self) -> dict[str, Any]:
        """JSON-ready values."""
        return as_json(self, rename={"items": "records", "more_items": "more_records"})


async def discarded_keys(
    engine: AsyncEngine, dlq_topic: str, keys: Collection[Key] | None = None
) -> set[Key]:
    """Which of ``keys`` (``None``: any) of ``dlq_topic`` are discarded."""
    if keys is not None and not keys:
        return set()
    columns = dlq_discards.c
    query = select(columns.dlq_partition, columns.dlq_offset).where(columns.dlq_topic == dlq_topic)
    if keys is not None:
        query = query.where(tuple_(columns.dlq_partition, columns.dlq_offset).in_(list(keys)))
    async with engine.connect() as connection:
        rows = (await connection.execute(query)).all()
    return {(row.dlq_partition, row.dlq_offset) for row in rows}


async def discarded_count(
    connection: AsyncConnection, dlq_topic: str, bounds: Mapping[int, tuple[int, int]]
) -> int:
    """How many letters ``dlq_topic`` still holds (``bounds``: ``{partition: (first offset,
    end offset)}``, :meth:`DlqReader.offsets`) are discarded: one count on the unique key of
    ``dlq_discards``. Discards of letters the topic no longer holds (retention) do not count."""
    query = select(func.count()).where(held_by(dlq_discards, dlq_topic, bounds))
    return int(await connection.scalar(query) or 0)


async def discarded_within(
    connection: AsyncConnection, dlq_topic: str, bounds: Mapping[int, tuple[int, int]]
) -> set[Key]:
    """The discarded letters of ``dlq_topic`` in ``bounds`` (``{partition: (from offset, to
    offset exclusive)}``): one range scan of ``dlq_discards``' unique key per partition, for
    a bounded read (a list of the letters' keys in the query instead is planned slowly)."""
    columns = dlq_discards.c
    query = select(columns.dlq_partition, columns.dlq_offset).where(
        held_by(dlq_discards, dlq_topic, bounds)
    )
    rows = (await connection.execute(query)).all()
    return {(row.dlq_partition, row.dlq_offset) for row in rows}


async def discard_of(
    engine: AsyncEngine, dlq_topic: str, partition: int, offset: int
) -> dict[str, Any] | None:
    """The discard of one letter (``discarded_ms``, ``discarded_by``, ``reason``,
    ``discard_id``), or ``None`` when it is not discarded."""
    columns = dlq_discards.c
    query = select(
        columns.discarded_ms, columns.discarded_by, columns.reason, columns.discard_id
    ).where(
        columns.dlq_topic == dlq_topic,
        columns.dlq_partition == partition,
        columns.dlq_offset == offset,
    )
    async with engine.connect() as connection:
        row = (await connection.execute(query)).mappings().first()
    return None if row is None else dict(row)


async def visible(
    records: AsyncIterator[DlqRecord], discarded: Collection[Key]
) -> AsyncIterator[DlqRecord]:
    """``records`` without the ``discarded`` ones (from :func:`discarded_keys`)."""
    async for record in records:
        if (record.partition, record.offset) not in discarded:
            yield record


async def discard(
    reader: DlqReader,
    engine: AsyncEngine,
    dlq_topic: str,
    wanted: DlqFilter,
    options: DiscardOptions,
    progress: Callable[[int, int], None] | None = None,
) -> DiscardSummary:
    """Discard (with ``options.undo``: un-discard) the letters of ``dlq_topic`` that match.

    ``progress(offsets covered, offsets to cover)`` is called as it goes. A letter discarded
    already is counted unchanged; the first discard's who and why are kept.
    """
    summary = DiscardSummary(
        str(uuid7()), dlq_topic, options.by, options.reason, options.dry_run, options.undo
    )
    ranges = await reader.plan(dlq_topic, wanted)
    total = sum(span.size for span in ranges)
    chunk: list[DlqRecord] = []
    async for record in reader.read(dlq_topic, wanted, ranges):
        summary.matched += 1
        chunk.append(record)
        if len(chunk) >= CHUNK:
            await _chunk(engine, dlq_topic, chunk, options, summary)
            chunk = []
        if progress is not None:
            progress(reader.progress, total)
    await _chunk(engine, dlq_topic, chunk, options, summary)
    if progress is not None:
        progress(total, total)
    return summary


async def _chunk(
    engine: AsyncEngine,
    dlq_topic: str,
    records: Iterable[DlqRecord],
    options: DiscardOptions,
    summary: DiscardSummary,
) -> None:
    records = list(records)
    if not records:
        return
    done = await discarded_keys(engine, dlq_topic, [(r.partition, r.offset) for r in records])
    if options.undo:
        changing = [r for r in records if (r.partition, r.offset) in done]
        status: DiscardStatus = "would restore" if options.dry_run else "restored"
        other: DiscardStatus = "not discarded"
    else:
        changing = [r for r in records if (r.partition, r.offset) not in done]
        status = "would discard" if options.dry_run else "discarded"
        other = "already discarded"
    if changing and not options.dry_run:
        await (_restore if options.undo else _insert)(engine, dlq_topic, changing, summary)
    chosen = {(r.partition, r.offset) for r in changing}
    for record in records:
        summary.add(
            DiscardItem(
                record.partition,
                record.offset,
                record.type,
                record.id,
                status if (record.partition, record.offset) in chosen else other,
            )
        )


async def _insert(
    engine: AsyncEngine, dlq_topic: str, records: list[DlqRecord], summary: DiscardSummary
) -> None:
    dialect = engine.dialect.name
    rows = [
        {
            "dlq_topic": dlq_topic,
            "dlq_partition": record.partition,
            "dlq_offset": record.offset,
            "discarded_ms": db_now_ms(dialect),
            "discarded_by": summary.by,
            "reason": summary.reason,
            "discard_id": summary.discard_id,
        }
        for record in records
    ]
    statement = (
        dialect_insert(dialect)(dlq_discards)
        .values(rows)
        .on_conflict_do_nothing(index_elements=["dlq_topic", "dlq_partition", "dlq_offset"])
    )
    async with engine.begin() as connection:
        await connection.execute(statement)


async def _restore(
    engine: AsyncEngine, dlq_topic: str, records: list[DlqRecord], _: DiscardSummary
) -> None:
    columns = dlq_discards.c
    keys = [(record.partition, record.offset) for record in records]
    statement = delete(dlq_discards).where(
        columns.dlq_topic == dlq_topic,
        tuple_(columns.dlq_partition, columns.dlq_offset).in_(keys),
    )
    async with engine.begin() as connection:
        await connection.execute(statement)
