"""The chaos run's ledger: one row per committed event, written in the producer's transaction.

In poll mode the outbox table itself is the ledger (the relay keeps published rows). In
logical mode the relay deletes published rows and WAL messages leave none, so the events are
counted here: for rows, by a trigger on the outbox's inserts (:data:`LEDGER_TRIGGER`); for WAL
messages, by the producer itself, in the same transaction and savepoint as the event.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, LargeBinary, MetaData, String, Table

chaos_ledger = Table(
    "chaos_ledger",
    MetaData(),
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("event_id", String(256), nullable=False),
    Column("kafka_key", LargeBinary),
)
"""Ordered by ``id``: per key, the order the producer committed its events in."""

LEDGER_TRIGGER = """
CREATE FUNCTION chaos_ledger_copy() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_ledger (id, event_id, kafka_key) VALUES (NEW.id, NEW.event_id, NEW.kafka_key);
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_ledger_copy AFTER INSERT ON outbox_events
FOR EACH ROW EXECUTE FUNCTION chaos_ledger_copy();
"""
"""Copies every outbox row into the ledger (its ``id`` is the row's)."""
