"""The invariants of logical mode, checked by its tests (real PostgreSQL and Kafka).

- everything committed is on Kafka (or, while a relay is down, still in the table or after
  the slot's confirmed position: the slot is never confirmed past a committed row or message
  that is not on Kafka);
- no committed row stays in the table once the relay is idle.
"""

from __future__ import annotations

import json

from aiokafka import ConsumerRecord
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay.logical import DECODED
from outboxkit.relay.pgoutput import Decoder, Message
from outboxkit.relay.slot import PUBLICATION
from sqlalchemy import func, select, text

from tests.support.kafka import read_topic

SEQ_SQL = """
INSERT INTO outbox_events (source, event_id, type, topic, kafka_key, shard, headers, payload,
  created_ms, available_ms, attempts)
SELECT '/test', 'bulk-' || g, 'seq', :topic, convert_to('key-' || (g % 50), 'UTF8'), g % 64,
  '{"ce_id": "bulk-' || g || '", "ce_source": "/test", "ce_type": "seq", '
  || '"ce_specversion": "1.0", "content-type": "application/json"}',
  convert_to('{"seq": ' || g || '}', 'UTF8'), now_ms, now_ms, 0
FROM generate_series(CAST(:start AS bigint), CAST(:stop AS bigint) - 1) AS g,
  (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms) AS clock
"""


def write_bulk(url: str, topic: str, start: int, count: int, per_tx: int = 50_000) -> None:
    """Write events ``start..start+count`` (``{"seq": n}``, key ``key-{n % 50}``) with one
    INSERT per ``per_tx`` rows: fast enough for the hundreds of thousands a catch-up needs."""
    engine = make_engine(url)
    for tx_start in range(start, start + count, per_tx):
        stop = min(tx_start + per_tx, start + count)
        with engine.begin() as conn:
            conn.execute(text(SEQ_SQL), {"topic": topic, "start": tx_start, "stop": stop})
    engine.dispose()


def pending_rows(url: str) -> int:
    """Rows still waiting in the table (not parked, not scheduled)."""
    engine = make_engine(url)
    with engine.connect() as conn:
        count = conn.scalar(
            select(func.count())
            .select_from(outbox_events)
            .where(
                outbox_events.c.published_ms.is_(None),
                outbox_events.c.parked_ms.is_(None),
                outbox_events.c.deliver_at_ms.is_(None),
            )
        )
    engine.dispose()
    return int(count or 0)


def pending_seqs(url: str) -> set[int]:
    """The seqs of the rows still pending in the table."""
    engine = make_engine(url)
    with engine.connect() as conn:
        payloads = conn.scalars(
            select(outbox_events.c.payload).where(
                outbox_events.c.published_ms.is_(None), outbox_events.c.parked_ms.is_(None)
            )
        ).all()
    engine.dispose()
    return {json.loads(payload)["seq"] for payload in payloads}


def seqs_of(records: list[ConsumerRecord]) -> list[int]:
    """The ``seq`` of each record, in topic order."""
    return [json.loads(record.value)["seq"] for record in records]


def unconfirmed_seqs(url: str) -> set[int]:
    """The seqs of the inserts and outbox WAL messages after the slot's confirmed position
    (peeked: nothing is consumed; the slot must not be in use)."""
    engine = make_engine(url)
    with engine.connect() as conn:
        slot = conn.scalar(
            text("SELECT slot_name FROM pg_replication_slots WHERE database = current_database()")
        )
        if slot is None:
            return set()
        data = conn.scalars(
            text(
                "SELECT data FROM pg_logical_slot_peek_binary_changes(:slot, NULL, NULL, "
                "'proto_version', '1', 'publication_names', :publication, 'binary', 'true', "
                "'messages', 'true')"
            ),
            {"slot": slot, "publication": PUBLICATION},
        ).all()
    engine.dispose()
    seqs: set[int] = set()
    for transaction in Decoder(DECODED).transactions([bytes(item) for item in data]):
        for change in transaction.inserts:
            if isinstance(change, Message):
                continue  # decoded by the tests that write messages
            seqs.add(json.loads(change[4])["seq"])
    return seqs


async def assert_nothing_lost(
    url: str, bootstrap: str, topic: str, committed: set[int], *, idle: bool = True
) -> list[ConsumerRecord]:
    """Assert the invariants for the ``committed`` seqs; return the topic's records.

    ``idle`` (the relay is done): every committed seq is on Kafka and the table holds no
    pending row. Otherwise (the relay is stopped midway): every committed seq is on Kafka, or
    still pending in the table, or after the slot's confirmed position.
    """
    records = await read_topic(bootstrap, topic, expected=len(committed))
    on_kafka = set(seqs_of(records))
    if idle:
        missing = committed - on_kafka
        assert not missing, f"{len(missing)} committed, not on Kafka: {sorted(missing)[:20]}"
        assert pending_rows(url) == 0, "committed rows left in the table of an idle relay"
    else:
        kept = on_kafka | unconfirmed_seqs(url) | pending_seqs(url)
        missing = committed - kept
        assert not missing, f"{len(missing)} neither on Kafka nor in the slot: {sorted(missing)}"
    return records
