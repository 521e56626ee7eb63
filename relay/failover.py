"""What the logical relay last saw of its server, and the WAL-message gaps a lost slot leaves.

A failover takes every logical slot before PostgreSQL 17 (slots are not copied to a standby),
and a slot created again starts at the new server's current WAL position. Rows are safe: the
relay catches up from the table (relay/catch_up.py). Outbox WAL messages are not: those after
the old slot's confirmed position exist only in the WAL, which no slot decodes any more.

So the relay remembers, per slot, the server's system identifier, its timeline and the slot's
confirmed position (``outbox_slot_positions``, written as it confirms, at most once a second).
The row is replicated with the database: a relay started after the promotion reads what the
old server last wrote, sees another timeline (or system), and knows the slot it finds (or
does not find) is not the one it confirmed. Whenever a slot is created again after one was
used, the WAL range between the old confirmed position and the new slot's start is a gap for
WAL messages: its outbox messages are counted with ``pg_walinspect`` where the server allows
it, and the gap is recorded in ``outbox_slot_gaps`` until an operator acknowledges it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from outboxkit.outbox.clock import db_now_ms
from outboxkit.outbox.tables import outbox_slot_gaps, outbox_slot_positions
from outboxkit.relay.slot import lsn_text
from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("outboxkit.relay")

COUNT_AT_MOST_BYTES = 4 << 30
"""Gaps longer than this are not counted (``pg_walinspect`` describes every record)."""

# The timeline the server writes WAL on now: the first 8 hex digits of its WAL file's name.
_SERVER = text(
    "SELECT system_identifier::text AS system_id, "
    "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int AS timeline "
    "FROM pg_control_system()"
)
# Outbox WAL messages of the transactions that committed in a WAL range (a savepoint's messages
# are its subtransaction's: listed by the top commit), and all those in the range. The records
# are read from ``scan_from``, before the range: a transaction that committed in it may have
# written messages before the old slot's position (its commit came after, so it was not
# published).
_COUNT = text(
    "WITH r AS (SELECT start_lsn, xid, resource_manager AS rm, record_type AS kind, "
    " description AS d FROM pg_get_wal_records_info(CAST(CAST(:scan_from AS text) AS pg_lsn), "
    " CAST(CAST(:to_lsn AS text) AS pg_lsn)) "
    " WHERE resource_manager IN ('LogicalMessage', 'Transaction')), "
    "commits AS (SELECT xid, d FROM r WHERE rm = 'Transaction' AND kind LIKE 'COMMIT%' "
    " AND start_lsn >= CAST(CAST(:from_lsn AS text) AS pg_lsn)), "
    "committed AS (SELECT CAST(xid AS text) AS x FROM commits UNION SELECT sub FROM commits, "
    " unnest(string_to_array(substring(d FROM 'subxacts: ([0-9 ]+)'), ' ')) AS sub "
    " WHERE sub <> ''), "
    "messages AS (SELECT start_lsn, CAST(xid AS text) AS x FROM r WHERE rm = 'LogicalMessage' "
    " AND d LIKE 'transactional, prefix \"outboxkit\";%') "
    "SELECT count(*) FILTER (WHERE x IN (SELECT x FROM committed)) AS lost, "
    "count(*) FILTER (WHERE start_lsn >= CAST(CAST(:from_lsn AS text) AS pg_lsn)) AS messages "
    "FROM messages"
)
LOOKBACK_BYTES = 64 << 20
"""How far before a gap the WAL is read for the messages of transactions committed in it."""


@dataclass(frozen=True, slots=True)
class Server:
    """The server a connection reached: its system identifier (shared by a primary and its
    physical standbys) and the timeline it writes on (a promotion starts a new one)."""

    system_id: str
    timeline: int

    def differs(self, seen: Seen) -> str | None:
        """How this server differs from the one ``seen`` was written on, or ``None``."""
        if self.system_id != seen.system_id:
            return f"system {seen.system_id} -> {self.system_id}"
        if self.timeline != seen.timeline:
            return f"timeline {seen.timeline} -> {self.timeline}"
        return None


@dataclass(frozen=True, slots=True)
class Seen:
    """What a relay last recorded of a slot (``outbox_slot_positions``)."""

    system_id: str
    timeline: int
    confirmed_lsn: int
    messages_seen_ms: int | None


@dataclass(frozen=True, slots=True)
class Gap:
    """A WAL range whose outbox WAL messages no slot decoded (``outbox_slot_gaps``)."""

    id: int
    slot_name: str
    cause: str
    from_lsn: str
    to_lsn: str
    lost_events: int | None
    count_note: str
    detected_ms: int
    acknowledged_ms: int | None
    acknowledged_by: str | None

    def line(self) -> str:
        """One line naming the gap, for logs, ``status`` and ``/readyz``."""
        lost = "an unknown number of" if self.lost_events is None else str(self.lost_events)
        return (
            f"slot {self.slot_name}: WAL-message gap {self.id} from {self.from_lsn} to "
            f"{self.to_lsn} ({self.cause}): {lost} outbox WAL message event(s) lost"
        )


async def server_of(engine: AsyncEngine) -> Server:
    """The server ``engine`` reaches now (a primary: a standby has no current WAL position)."""
    async with engine.connect() as conn:
        row = (await conn.execute(_SERVER)).one()
    return Server(str(row.system_id), int(row.timeline))


async def load_seen(engine: AsyncEngine, slot: str) -> Seen | None:
    """What was last recorded of ``slot``, if anything."""
    table = outbox_slot_positions.c
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(
                    table.system_id, table.timeline, table.confirmed_lsn, table.messages_seen_ms
                ).where(table.slot_name == slot)
            )
        ).first()
    if row is None:
        return None
    return Seen(row.system_id, row.timeline, row.confirmed_lsn, row.messages_seen_ms)


async def remember(
    engine: AsyncEngine, slot: str, server: Server, confirmed_lsn: int, *, messages: bool
) -> bool:
    """Record ``slot``'s confirmed position on ``server`` (and that it decoded outbox WAL
    messages, if ``messages``; once recorded, that stays); ``False`` if ``engine`` reaches
    another server now (a failover since: the new server keeps what it received of the old
    one's records, whose positions never pass the point where its timeline forked)."""
    now = db_now_ms("postgresql")
    values = {
        "system_id": server.system_id,
        "timeline": server.timeline,
        "confirmed_lsn": confirmed_lsn,
        "messages_seen_ms": now if messages else None,
        "updated_ms": now,
    }
    statement = insert(outbox_slot_positions).values(slot_name=slot, **values)
    seen_before = outbox_slot_positions.c.messages_seen_ms
    statement = statement.on_conflict_do_update(
        index_elements=["slot_name"],
        set_={
            **{name: statement.excluded[name] for name in values},
            "messages_seen_ms": func.coalesce(statement.excluded.messages_seen_ms, seen_before),
        },
    )
    async with engine.begin() as conn:
        row = (await conn.execute(_SERVER)).one()
        if Server(str(row.system_id), int(row.timeline)) != server:
            return False
        await conn.execute(statement)
    return True


async def count_lost(engine: AsyncEngine, from_lsn: int, to_lsn: int) -> tuple[int | None, str]:
    """The outbox WAL messages of committed transactions between the two positions, read from
    the WAL with ``pg_walinspect`` (created here if it is missing and the role may), and a note
    saying how the count was made or why there is none."""
    if to_lsn <= from_lsn:
        return 0, "an empty range"
    if to_lsn - from_lsn > COUNT_AT_MOST_BYTES:
        return None, f"not counted: the range is {to_lsn - from_lsn} bytes of WAL"
    values = {"from_lsn": lsn_text(from_lsn), "to_lsn": lsn_text(to_lsn)}
    note = "counted in the WAL with pg_walinspect (committed transactions)"
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        try:
            await _walinspect(conn)
            row = None
            # From before the range, as far back as the server still has the WAL: the start
            # of the position's 16 MB segment at least, which it has.
            for scan_from in (from_lsn - LOOKBACK_BYTES, from_lsn & ~((16 << 20) - 1)):
                try:
                    scan = {**values, "scan_from": lsn_text(max(scan_from, 1))}
                    row = (await conn.execute(_COUNT, scan)).one()
                    break
                except DBAPIError:
                    continue
            if row is None:
                note += (
                    "; the WAL before the range is gone: the messages a transaction wrote "
                    "before the old slot's position are not counted"
                )
                row = (
                    await conn.execute(_COUNT, {**values, "scan_from": lsn_text(from_lsn)})
                ).one()
        except DBAPIError as error:
            reason = str(error.orig).strip().splitlines()[0]
            return None, f"not counted: pg_walinspect could not read the range ({reason})"
    lost, messages = int(row.lost), int(row.messages)
    if messages > lost:
        note += (
            f"; {messages - lost} more message(s) in the range, of transactions that did "
            "not commit in it (rolled back, cut off by the failover, or committed after the "
            "new slot's start, which publishes them), are not counted"
        )
    return lost, note


async def _walinspect(conn: AsyncConnection) -> None:
    installed = await conn.scalar(
        text("SELECT count(*) FROM pg_extension WHERE extname = 'pg_walinspect'")
    )
    if not installed:
        await conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))


async def record_gap(
    engine: AsyncEngine,
    slot: str,
    cause: str,
    from_lsn: int,
    to_lsn: int,
    lost: int | None,
    note: str,
) -> Gap:
    """Record a gap (once per range) and return it as stored."""
    values = {
        "slot_name": slot,
        "cause": cause[:200],
        "from_lsn": from_lsn,
        "to_lsn": to_lsn,
        "lost_events": lost,
        "count_note": note,
        "detected_ms": db_now_ms("postgresql"),
    }
    async with engine.begin() as conn:
        await conn.execute(
            insert(outbox_slot_gaps)
            .values(**values)
            .on_conflict_do_nothing(index_elements=["slot_name", "from_lsn", "to_lsn"])
        )
        table = outbox_slot_gaps.c
        row = (
            await conn.execute(
                select(outbox_slot_gaps).where(
                    table.slot_name == slot, table.from_lsn == from_lsn, table.to_lsn == to_lsn
                )
            )
        ).one()
    return gap_of(row)


async def open_gaps(conn: AsyncConnection) -> list[Gap]:
    """The gaps no operator acknowledged yet, oldest first."""
    rows = await conn.execute(
        select(outbox_slot_gaps)
        .where(outbox_slot_gaps.c.acknowledged_ms.is_(None))
        .order_by(outbox_slot_gaps.c.id)
    )
    return [gap_of(row) for row in rows]


def gap_of(row: object) -> Gap:
    """A :class:`Gap` from a row of ``outbox_slot_gaps``."""
    values = row._mapping  # type: ignore[attr-defined]
    return Gap(
        int(values["id"]),
        str(values["slot_name"]),
        str(values["cause"]),
        lsn_text(int(values["from_lsn"])),
        lsn_text(int(values["to_lsn"])),
        None if values["lost_events"] is None else int(values["lost_events"]),
        str(values["count_note"]),
        int(values["detected_ms"]),
        values["acknowledged_ms"],
        values["acknowledged_by"],
    )
