"""The inbox table: one row per event a consumer has applied, keyed by ``(consumer, source, id)``.

It lives in :data:`outboxkit.outbox.tables.metadata` beside the outbox tables, and is created by the
migration ``0002_inbox``.
"""

from __future__ import annotations

from outboxkit.outbox.tables import metadata
from sqlalchemy import BigInteger, Column, Index, Integer, LargeBinary, MetaData, String, Table

CONSUMER_MAX = 200
SOURCE_MAX = 512
EVENT_ID_MAX = 256

inbox_events = Table(
    "inbox_events",
    metadata,
    Column("consumer", String(CONSUMER_MAX), primary_key=True),
    Column("source", String(SOURCE_MAX), primary_key=True),
    Column("event_id", String(EVENT_ID_MAX), primary_key=True),
    Column("processed_ms", BigInteger, nullable=False),
    # The time in the event id (outboxkit.outbox.id_time; 0: none). On PostgreSQL the table is
    # range-partitioned by it and it is the last column of the primary key (a pure function of
    # event_id, so the key stays unique per event); on SQLite it is stored, not keyed.
    Column("id_ms", BigInteger, nullable=False, server_default="0"),
)

# Retention deletes the oldest rows first; partition drops read a partition's newest claim.
Index("ix_inbox_events_processed_ms", inbox_events.c.processed_ms)

# PostgreSQL: the inbox as it was before partitions (migration 0016_inbox_partitions renamed it).
# No claim goes in; claims look here too until retention has emptied it (docs/operations.md).
inbox_events_unpartitioned = Table(
    "inbox_events_unpartitioned",
    MetaData(),  # not outboxkit's metadata: it exists on PostgreSQL only, made by a rename
    Column("consumer", String(CONSUMER_MAX), primary_key=True),
    Column("source", String(SOURCE_MAX), primary_key=True),
    Column("event_id", String(EVENT_ID_MAX), primary_key=True),
    Column("processed_ms", BigInteger, nullable=False),
)

# Each consumer's inbox window, as its retention last ran: a partition is dropped only when
# every claim in it is older than its own consumer's window.
inbox_windows = Table(
    "inbox_windows",
    metadata,
    Column("consumer", String(CONSUMER_MAX), primary_key=True),
    Column("window_ms", BigInteger, nullable=False),
    Column("seen_ms", BigInteger, nullable=False),
)

# Dead letters that keep the order (``on_dead_letter="sequence"``): a key whose head record was
# dead-lettered is *blocked* for the consumer; its later records are *held* until the head is
# resolved, then applied in their order. Created by the migration ``0013_consumer_sequences``.
KEY_HASH_MAX = 64  # sha256 hex of the raw Kafka key
KEY_SHOWN_MAX = 200
TOPIC_MAX = 249

consumer_sequences = Table(
    "consumer_sequences",
    metadata,
    Column("consumer", String(CONSUMER_MAX), primary_key=True),
    Column("topic", String(TOPIC_MAX), primary_key=True),
    Column("key_hash", String(KEY_HASH_MAX), primary_key=True),
    Column("key_shown", String(KEY_SHOWN_MAX), nullable=False),
    Column("kafka_partition", Integer, nullable=False),
    # "blocked": its head is dead-lettered; "released": the head was applied, skipped or
    # released by an operator, and the held records are being applied (the row goes when done).
    Column("state", String(16), nullable=False),
    Column("head_source", String(SOURCE_MAX), nullable=True),
    Column("head_event_id", String(EVENT_ID_MAX), nullable=True),
    Column("head_offset", BigInteger, nullable=True),
    Column("head_error", String(200), nullable=True),
    Column("held", Integer, nullable=False),
    Column("blocked_ms", BigInteger, nullable=False),
    Column("resolution", String(16), nullable=True),
    Column("resolved_by", String(128), nullable=True),
    Column("reason", String(500), nullable=True),
    Column("drainer", String(64), nullable=True),
    Column("drain_until_ms", BigInteger, nullable=True),
)
Index("ix_consumer_sequences_state", consumer_sequences.c.consumer, consumer_sequences.c.state)

consumer_held_events = Table(
    "consumer_held_events",
    metadata,
    Column("consumer", String(CONSUMER_MAX), primary_key=True),
    Column("topic", String(TOPIC_MAX), primary_key=True),
    Column("key_hash", String(KEY_HASH_MAX), primary_key=True),
    Column("kafka_offset", BigInteger, primary_key=True),
    Column("kafka_partition", Integer, nullable=False),
    Column("source", String(SOURCE_MAX), nullable=True),
    Column("event_id", String(EVENT_ID_MAX), nullable=True),
    Column("event_type", String(EVENT_ID_MAX), nullable=True),
    Column("record_key", LargeBinary, nullable=True),
    Column("record_value", LargeBinary, nullable=True),
    Column("record_headers", LargeBinary, nullable=False),
    Column("record_timestamp", BigInteger, nullable=True),
    Column("held_ms", BigInteger, nullable=False),
)
