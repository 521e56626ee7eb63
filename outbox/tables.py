"""Table definitions of the outbox and of the relay's coordination state.

Times are epoch milliseconds from the database clock (see :mod:`.clock`), so relays on
different hosts compare leases against one clock.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

# SQLite only autoincrements an INTEGER PRIMARY KEY.
_BIG_ID = BigInteger().with_variant(Integer(), "sqlite")

outbox_events = Table(
    "outbox_events",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("source", String(512), nullable=False),
    Column("event_id", String(256), nullable=False),
    Column("type", String(256), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("kafka_key", LargeBinary, nullable=True),
    Column("shard", SmallInteger, nullable=False),
    Column("headers", Text, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("available_ms", BigInteger, nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("last_error", Text, nullable=True),
    Column("published_ms", BigInteger, nullable=True),
    Column("parked_ms", BigInteger, nullable=True),
    # Scheduled delivery: not published before this time (database clock); NULL for the usual
    # row, published as soon as it is committed.
    Column("deliver_at_ms", BigInteger, nullable=True),
    UniqueConstraint("source", "event_id", name="uq_outbox_events_source_event_id"),
)

_UNSETTLED = outbox_events.c.published_ms.is_(None) & outbox_events.c.parked_ms.is_(None)
# The relay's claim walks this partial index in id order and filters its shards; published
# rows kept for retention never enter it, so it stays as small as the backlog. Scheduled rows
# never enter it either: a million timers due next week must not be walked by every claim.
Index(
    "ix_outbox_events_pending",
    outbox_events.c.id,
    postgresql_where=_UNSETTLED & outbox_events.c.deliver_at_ms.is_(None),
    sqlite_where=_UNSETTLED & outbox_events.c.deliver_at_ms.is_(None),
)
# Scheduled rows not yet published, in due order: the claim reads the due ones from here, the
# relay its next wake-up time.
Index(
    "ix_outbox_events_scheduled",
    outbox_events.c.deliver_at_ms,
    outbox_events.c.id,
    postgresql_where=_UNSETTLED & outbox_events.c.deliver_at_ms.is_not(None),
    sqlite_where=_UNSETTLED & outbox_events.c.deliver_at_ms.is_not(None),
)
Index(
    "ix_outbox_events_published",
    outbox_events.c.published_ms,
    postgresql_where=outbox_events.c.published_ms.is_not(None),
    sqlite_where=outbox_events.c.published_ms.is_not(None),
)
Index(
    "ix_outbox_events_parked",
    outbox_events.c.parked_ms,
    postgresql_where=outbox_events.c.parked_ms.is_not(None),
    sqlite_where=outbox_events.c.parked_ms.is_not(None),
)

outbox_relays = Table(
    "outbox_relays",
    metadata,
    Column("relay_id", String(64), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_ms", BigInteger, nullable=False),
    Column("heartbeat_ms", BigInteger, nullable=False),
    # When the relay last had a row acknowledged (database clock, written with each
    # heartbeat; NULL until then): the stall check of ``status`` (migration 0019_relay_published).
    Column("published_ms", BigInteger, nullable=True),
)

outbox_shard_leases = Table(
    "outbox_shard_leases",
    metadata,
    Column("shard", SmallInteger, primary_key=True, autoincrement=False),
    Column("holder", String(64), nullable=True),
    Column("expires_ms", BigInteger, nullable=False, default=0),
)

# A logical slot being caught up with the rows written before it existed (relay/catch_up.py):
# kept until the catch-up is done, so a relay that dies midway leaves it to the next one.
outbox_slot_catch_ups = Table(
    "outbox_slot_catch_ups",
    metadata,
    Column("slot_name", String(63), primary_key=True),
    # The highest id before the slot was created: every row the slot decodes has a higher one.
    Column("after_id", BigInteger, nullable=False),
    # The highest id once the slot existed: the catch-up publishes pending rows up to it.
    Column("until_id", BigInteger, nullable=True),
    Column("published", BigInteger, nullable=False, default=0),
    Column("started_ms", BigInteger, nullable=False),
)

# What the logical relay last saw of its slot's server (relay/failover.py): the server's
# system identifier, its timeline and the slot's confirmed position, so that a relay started
# after a failover (the row came with the replicated database) notices the new server.
outbox_slot_positions = Table(
    "outbox_slot_positions",
    metadata,
    Column("slot_name", String(63), primary_key=True),
    Column("system_id", String(20), nullable=False),  # pg_control_system(), unsigned 64 bits
    Column("timeline", Integer, nullable=False),
    Column("confirmed_lsn", BigInteger, nullable=False),
    # When the slot last decoded an outbox WAL message (null: never): the mode is in use.
    Column("messages_seen_ms", BigInteger, nullable=True),
    Column("updated_ms", BigInteger, nullable=False),
)

# WAL ranges whose outbox WAL messages a slot could not decode (a failover or a dropped
# slot): kept, and reported by status and /readyz, until an operator acknowledges them.
outbox_slot_gaps = Table(
    "outbox_slot_gaps",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("slot_name", String(63), nullable=False),
    Column("cause", String(200), nullable=False),
    Column("from_lsn", BigInteger, nullable=False),  # the old slot's last confirmed position
    Column("to_lsn", BigInteger, nullable=False),  # where the new slot starts
    Column("lost_events", BigInteger, nullable=True),  # null: not known
    Column("count_note", Text, nullable=False),  # how the count was made, or why it is unknown
    Column("detected_ms", BigInteger, nullable=False),
    Column("acknowledged_ms", BigInteger, nullable=True),
    Column("acknowledged_by", String(200), nullable=True),
    UniqueConstraint("slot_name", "from_lsn", "to_lsn", name="uq_outbox_slot_gaps_range"),
)
