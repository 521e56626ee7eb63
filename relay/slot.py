"""The logical replication slot the relay reads outbox inserts from, with SQL-level functions.

The slot decodes with ``pgoutput`` through the publication ``outboxkit_outbox`` (inserts into
``outbox_events`` only; migration 0010 creates it). The default reader
streams it over the replication protocol (:mod:`~outboxkit.relay.replication`, psycopg2); the
SQL-level reader peeks with ``pg_logical_slot_peek_binary_changes`` (nothing is consumed) on
the relay's asyncpg engine. Either way a position is confirmed only once Kafka has acknowledged
everything before it, after the DELETE of the published rows: by the stream's flush feedback,
or with ``pg_replication_slot_advance``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.errors import OutboxError
from outboxkit.relay.replication import SlotStream
from sqlalchemy import BigInteger, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

PUBLICATION = "outboxkit_outbox"
FAILOVER_SLOTS_FROM = 17
"""The first PostgreSQL major version whose logical slots can follow a failover
(``failover = true``, synchronized to standbys with ``sync_replication_slots``)."""
PLUGIN = "pgoutput"
# Relation messages ('R' = 82) are sent once per decoding session, so the same transactions
# read again carry them at other places: ``skip`` counts the other messages only.
_PEEK = text(
    "SELECT data FROM (SELECT data, get_byte(data, 0) = 82 AS relation, "
    "count(*) FILTER (WHERE get_byte(data, 0) <> 82) OVER (ROWS UNBOUNDED PRECEDING) AS n "
    "FROM pg_logical_slot_peek_binary_changes(:slot, NULL, :changes, 'proto_version', '1', "
    "'publication_names', :publication, 'binary', 'true')) AS messages "
    "WHERE n > :skip OR relation"
)
# A non-transactional message: the stream receives it after every commit before it. The
# transaction id makes the statement commit with a WAL flush, so the message is sent at once.
_MARKER = text(
    "SELECT pg_logical_emit_message(false, 'outboxkit-marker', '')::text, txid_current()"
)
_ADVANCE = text("SELECT pg_replication_slot_advance(:slot, :lsn)")
_DELETE = text("DELETE FROM outbox_events WHERE id = ANY(:ids)").bindparams(
    bindparam("ids", type_=ARRAY(BigInteger))
)
# How long a DELETE of published rows is repeated for rows it did not find (their commit not
# yet visible); far longer than that takes on a loaded server.
VISIBLE_WITHIN_S = 5.0
log = logging.getLogger("outboxkit.relay")
_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")


class LogicalModeError(OutboxError):
    """Logical mode cannot run on this database (not PostgreSQL, ``wal_level`` is not
    ``logical``, no publication, or the slot belongs to something else); retrying cannot help."""


def default_slot_name(database: str) -> str:
    """``outboxkit_<database>``, made a valid slot name (slots are per server, not per
    database, so two databases on one server get two slots)."""
    return ("outboxkit_" + re.sub(r"[^a-z0-9_]", "_", database.lower()))[:63]


def check_slot_name(name: str) -> str:
    """Return ``name`` if it is a valid replication slot name, else raise :class:`ValueError`."""
    if not _SLOT_NAME.match(name):
        raise ValueError(f"invalid slot name {name!r}: 1-63 of a-z, 0-9 and _")
    return name


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(lsn: str) -> int:
    """An LSN from PostgreSQL's text (``16/B374D848``)."""
    high, low = lsn.split("/")
    return (int(high, 16) << 32) | int(low, 16)


async def require_logical(engine: AsyncEngine) -> None:
    """Raise :class:`LogicalModeError` unless logical mode can run on ``engine``'s database."""
    if not dialect_of(engine).logical_replication:
        raise LogicalModeError(
            f"logical mode needs PostgreSQL, not {engine.dialect.name}: use --mode poll"
        )
    async with engine.connect() as conn:
        wal_level = await conn.scalar(text("SHOW wal_level"))
        publication = await conn.scalar(
            text("SELECT count(*) FROM pg_publication WHERE pubname = :name"),
            {"name": PUBLICATION},
        )
    if wal_level != "logical":
        raise LogicalModeError(
            f"logical mode needs wal_level=logical (the server has {wal_level}; changing it "
            "needs a restart): use --mode poll"
        )
    if not publication:
        raise LogicalModeError(
            f"publication {PUBLICATION} is missing: run `outboxkit migrate` (0010 creates it)"
        )


_REFUSAL = text(
    "SELECT r.rolreplication OR r.rolsuper AS replication, current_user AS role, "
    "has_table_privilege('outbox_events', 'SELECT, INSERT, UPDATE, DELETE') AS table_ok, "
    "(SELECT count(*) FROM pg_replication_slots) AS slots, "
    "(SELECT count(*) FROM pg_replication_slots WHERE slot_name = :slot) AS mine, "
    "current_setting('max_replication_slots')::int AS max_slots, "
    "(SELECT count(*) FROM pg_stat_replication) AS senders, "
    "(SELECT count(*) FROM pg_replication_slots WHERE slot_name = :slot AND active) AS busy, "
    "current_setting('max_wal_senders')::int AS max_senders "
    "FROM pg_roles AS r WHERE r.rolname = current_user"
)


async def refusal(engine: AsyncEngine, slot: str) -> str | None:
    """Why this role cannot stream ``slot`` now (one line, naming what to change), or
    ``None``: no REPLICATION attribute, no privileges on ``outbox_events``, every
    ``max_replication_slots`` taken (the slot still to create), or every ``max_wal_senders``
    busy. The last two may come back; a relay waits for them, ``relay --drain`` stops."""
    async with engine.connect() as conn:
        row = (await conn.execute(_REFUSAL, {"slot": slot})).one()
    if not row.replication:
        return (
            f"role {row.role} has no REPLICATION attribute, needed to stream slot {slot} "
            f"(ALTER ROLE {row.role} REPLICATION, or --mode poll)"
        )
    if not row.table_ok:
        return (
            f"role {row.role} lacks SELECT, INSERT, UPDATE or DELETE on outbox_events "
            "(GRANT them, or use the role that ran `outboxkit migrate`)"
        )
    if not row.mine and row.slots >= row.max_slots:
        return (
            f"all {row.max_slots} replication slots are in use (max_replication_slots): "
            f"slot {slot} cannot be created"
        )
    if not row.busy and row.senders >= row.max_senders:
        return f"all {row.max_senders} WAL senders are busy (max_wal_senders)"
    return None


@dataclass(frozen=True)
class SlotLag:
    """A logical slot of this database: how far its confirmed position trails the WAL, how
    much WAL it keeps, and the age of the oldest outbox insert not yet confirmed (the oldest
    unpublished, unscheduled row: logical mode deletes rows as it confirms them); its
    ``wal_status`` (``lost``: invalidated, the relay recreates it) and, while a relay catches
    it up with the rows written before it, how many of those it published."""

    name: str
    active: bool
    lag_bytes: int
    retained_bytes: int
    oldest_unconfirmed_age_s: float | None
    wal_status: str = "reserved"
    catch_up_published: int | None = None


class Slot:
    """One logical replication slot of the outbox, read and confirmed through ``engine``."""

    def __init__(self, engine: AsyncEngine, name: str) -> None:
        self.engine = engine
        self.name = check_slot_name(name)
        # The replication session reading the slot, if the stream reader is used: it holds
        # the slot, so confirming is its flush feedback (the slot cannot be advanced by SQL).
        self.stream: SlotStream | None = None
        self.late_deletes = 0  # confirmations whose DELETE first missed rows (not yet visible)

    async def ensure(self) -> bool:
        """Create the slot if it does not exist; return ``True`` if it was created now.

        A slot of that name on another database or with another plugin is refused
        (:class:`LogicalModeError`): it is not this relay's.
        """
        if await self.inspect() is not None:
            return False
        await self.create()
        return True

    async def inspect(self) -> str | None:
        """The slot's ``wal_status`` (``reserved``, ``extended``, ``unreserved``, ``lost``:
        invalidated), ``creating`` while a session is still creating it (it has no consistent
        point yet: commits until then are in no slot), or ``None`` if it does not exist. A slot
        of that name on another database or with another plugin is refused
        (:class:`LogicalModeError`)."""
        async with self.engine.connect() as conn:
            found = (
                await conn.execute(
                    text(
                        "SELECT database, plugin, CASE WHEN confirmed_flush_lsn IS NULL "
                        "THEN 'creating' ELSE coalesce(wal_status, 'reserved') END AS wal_status, "
                        "current_database() AS current FROM pg_replication_slots "
                        "WHERE slot_name = :slot"
                    ),
                    {"slot": self.name},
                )
            ).first()
        if found is None:
            return None
        if (found.database, found.plugin) != (found.current, PLUGIN):
            raise LogicalModeError(
                f"replication slot {self.name} belongs to database {found.database} "
                f"(plugin {found.plugin}): give this relay another --slot"
            )
        return str(found.wal_status)

    async def create(self) -> None:
        """Create the slot (it must not exist). On PostgreSQL 17 and later it is a failover
        slot (``failover = true``): synchronized to standbys that have ``sync_replication_slots``
        on, so it survives a promotion (docs/relay.md, "Failover")."""
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            if await _major_version(conn) >= FAILOVER_SLOTS_FROM:
                create = "pg_create_logical_replication_slot(:slot, :plugin, false, false, true)"
            else:
                create = "pg_create_logical_replication_slot(:slot, :plugin)"
            await conn.execute(text(f"SELECT {create}"), {"slot": self.name, "plugin": PLUGIN})

    async def fails_over(self) -> bool:
        """Whether the slot is a failover slot (PostgreSQL 17+), which a promoted standby
        has (synchronized) rather than one created on this server."""
        async with self.engine.connect() as conn:
            if await _major_version(conn) < FAILOVER_SLOTS_FROM:
                return False
            return bool(
                await conn.scalar(
                    text("SELECT failover FROM pg_replication_slots WHERE slot_name = :slot"),
                    {"slot": self.name},
                )
            )

    async def peek(self, changes: int, skip: int = 0) -> list[bytes]:
        """The pgoutput messages after the confirmed position, less the first ``skip`` (not
        counting relation messages, which are always returned): whole transactions, stopping
        after the one that reaches ``changes`` more messages. Nothing is consumed (the server
        decodes the skipped ones again, but does not send them)."""
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            result = await conn.execute(
                _PEEK,
                {
                    "slot": self.name,
                    "changes": skip + changes,
                    "publication": PUBLICATION,
                    "skip": skip,
                },
            )
            return [row[0] for row in result]

    async def confirm(self, lsn: int, published_ids: Sequence[int]) -> None:
        """Delete the published rows, then move the slot's confirmed position to ``lsn``
        (through the stream's feedback when a stream reads the slot).

        The DELETE commits first: a crash between the two leaves the slot behind, so those
        rows are decoded from the WAL and published again (duplicates, never a loss), and no
        published row is ever left pending behind the slot's position. A slot already past
        ``lsn`` (another relay confirmed further after a takeover) is left as it is.

        The server sends a transaction once its commit record is in the WAL, a moment before
        other sessions see the commit: a DELETE in that moment finds fewer rows than it was
        given. It is repeated (with growing pauses, for up to :data:`VISIBLE_WITHIN_S`) until
        it has deleted them all, and the slot waits meanwhile; rows still missing then were
        deleted by someone else (or by this relay, before a crash or a lost stream).
        """
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            rows = [row_id for row_id in published_ids if row_id > 0]  # not WAL messages
            if rows:
                missing = len(rows) - (await conn.execute(_DELETE, {"ids": rows})).rowcount
                if missing > 0:
                    await self._delete_when_visible(conn, rows, missing)
            if self.stream is not None:
                self.stream.confirm(lsn)
                return
            try:
                await conn.execute(_ADVANCE, {"slot": self.name, "lsn": lsn})
            except DBAPIError as error:
                if "cannot advance replication slot" not in str(error.orig):
                    raise

    async def _delete_when_visible(
        self, conn: AsyncConnection, rows: list[int], missing: int
    ) -> None:
        self.late_deletes += 1
        deadline = time.monotonic() + VISIBLE_WITHIN_S
        pause = 0.001
        while missing > 0 and time.monotonic() < deadline:
            await asyncio.sleep(pause)
            pause = min(0.1, pause * 2)
            missing -= (await conn.execute(_DELETE, {"ids": rows})).rowcount
        if missing > 0:
            log.info(
                "%d of %d published rows were no longer in the table (deleted before: a "
                "transaction read again after a lost stream or a crash)",
                missing,
                len(rows),
            )

    async def marker(self) -> int:
        """Write a non-transactional marker message; return its LSN."""
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            return parse_lsn(str(await conn.scalar(_MARKER)))

    async def drop(self) -> bool:
        """Drop the slot if it exists (it must not be in use); ``True`` if it existed."""
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            dropped = await conn.scalar(
                text(
                    "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots "
                    "WHERE slot_name = :slot"
                ),
                {"slot": self.name},
            )
        return bool(dropped)


async def _major_version(conn: AsyncConnection) -> int:
    return (
        int(await conn.scalar(text("SELECT current_setting('server_version_num')::int")) or 0)
        // 10000
    )


async def slot_state(conn: AsyncConnection, name: str) -> SlotLag | None:
    """Slot ``name``'s activity, ``wal_status`` and lag (one row of ``pg_replication_slots``,
    none of the outbox: ``retained_bytes`` 0 and no insert age), or ``None`` if it does not
    exist."""
    row = (
        await conn.execute(
            text(
                "SELECT active, coalesce(wal_status, 'reserved') AS wal_status, "
                "coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint "
                "AS lag FROM pg_replication_slots WHERE slot_name = :slot"
            ),
            {"slot": name},
        )
    ).first()
    if row is None:
        return None
    return SlotLag(name, bool(row.active), int(row.lag), 0, None, str(row.wal_status))


async def slot_lags(conn: AsyncConnection) -> list[SlotLag]:
    """The logical slots of the connection's database (none on SQLite)."""
    if not dialect_of(conn).logical_replication:
        return []
    query = text(
        "SELECT s.slot_name, active, coalesce(wal_status, 'reserved') AS wal_status, "
        "c.published AS catch_up_published, "
        "coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint AS lag, "
        "coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint AS retained, "
        "(SELECT extract(epoch FROM clock_timestamp()) * 1000 - min(created_ms) "
        " FROM outbox_events WHERE published_ms IS NULL AND parked_ms IS NULL "
        " AND deliver_at_ms IS NULL) AS age_ms "
        "FROM pg_replication_slots AS s "
        "LEFT JOIN outbox_slot_catch_ups AS c ON c.slot_name = s.slot_name "
        "WHERE slot_type = 'logical' AND database = current_database() ORDER BY s.slot_name"
    )
    return [
        SlotLag(
            row.slot_name,
            bool(row.active),
            int(row.lag),
            int(row.retained),
            None if row.age_ms is None else max(0.0, float(row.age_ms)) / 1000,
            str(row.wal_status),
            None if row.catch_up_published is None else int(row.catch_up_published),
        )
        for row in await conn.execute(query)
    ]
