"""Dead-letter records as the tools read them back, counted per cause, and as JSON."""

from __future__ import annotations

import json

from aiokafka import ConsumerRecord
from outboxkit.consumers.dlq_headers import DeadLetter, Header
from outboxkit.ops.dlq.grouping import group_by_cause
from outboxkit.ops.dlq.reader import DlqFilter, DlqRecord

# The keys `dlq list --json` has always written for a record: scripts read them.
RECORD_KEYS = {
    "truncated",
    "original_size",
    "topic",
    "partition",
    "offset",
    "timestamp_ms",
    "type",
    "source",
    "id",
    "error_class",
    "error_message",
    "fingerprint",
    "attempts",
    "original_topic",
    "original_partition",
    "original_offset",
    "original_timestamp_ms",
    "consumer_group",
    "first_failure_ms",
    "last_failure_ms",
    "value_bytes",
}


def dead_lettered(offset: int, order: int, error_class: str, at_ms: int) -> DlqRecord:
    """A record of ``orders.dlq`` as the runtime writes it for order ``order``."""
    letter = DeadLetter(
        topic="orders",
        partition=0,
        offset=100 + order,
        timestamp=at_ms - 50,
        key=b"cust-1",
        value=json.dumps({"order": order}).encode(),
        headers=[("ce_type", b"order.placed"), ("ce_source", b"/shop"), ("ce_id", b"%d" % order)],
        error_class=error_class,
        error_message=f"order {order} exceeds the limit of 500",
        attempts=1,
        first_failure_ms=at_ms - 10,
        last_failure_ms=at_ms - 5,
    )
    headers: list[Header] = letter.to_headers("billing")
    return DlqRecord.from_record(
        ConsumerRecord(
            topic="orders.dlq",
            partition=1,
            offset=offset,
            timestamp=at_ms,
            timestamp_type=0,
            key=letter.key,
            value=letter.value,
            checksum=None,
            serialized_key_size=6,
            serialized_value_size=len(letter.value or b""),
            headers=headers,
        )
    )


def test_a_record_reads_back_with_its_event_and_its_place_in_the_dead_letter_topic() -> None:
    record = dead_lettered(7, 17, "permanent:OrderRejected", 1_700_000_000_000)
    assert (record.topic, record.partition, record.offset) == ("orders.dlq", 1, 7)
    assert (record.type, record.source, record.id) == ("order.placed", "/shop", "17")
    assert (record.letter.topic, record.letter.offset) == ("orders", 117)
    assert DlqFilter(error_classes=frozenset({"OrderRejected"})).matches(record)
    assert not DlqFilter(error_classes=frozenset({"exhausted"})).matches(record)


def test_record_json_has_the_published_keys_and_never_the_payload() -> None:
    record = dead_lettered(7, 17, "permanent:OrderRejected", 1_700_000_000_000)
    document = record.to_json()
    assert set(document) == RECORD_KEYS
    assert document["timestamp_ms"] == 1_700_000_000_000
    assert document["original_timestamp_ms"] == 1_700_000_000_000 - 50
    assert (document["original_topic"], document["original_offset"]) == ("orders", 117)
    assert document["consumer_group"] == "billing"
    assert document["value_bytes"] == len(b'{"order": 17}')
    text = json.dumps(document)
    assert "cust-1" not in text and '"order"' not in text  # neither the key nor the payload


def test_failures_are_counted_per_cause_whatever_values_the_messages_name() -> None:
    records = [
        dead_lettered(0, 17, "permanent:OrderRejected", 3_000),
        dead_lettered(1, 42, "permanent:OrderRejected", 1_000),
        dead_lettered(2, 42, "exhausted:TimeoutError", 2_000),
        dead_lettered(3, 99, "permanent:OrderRejected", 2_000),
    ]
    rejected, timed_out = group_by_cause(records)
    assert (rejected.count, rejected.first_ms, rejected.last_ms) == (3, 1_000, 3_000)
    assert rejected.pattern == "order <num> exceeds the limit of <num>"
    assert timed_out.count == 1
    assert rejected.to_json() == {
        "fingerprint": records[0].fingerprint_id,
        "error_class": "permanent:OrderRejected",
        "pattern": "order <num> exceeds the limit of <num>",
        "count": 3,
        "first_ms": 1_000,
        "last_ms": 3_000,
        "original_topics": ["orders"],
        "example": {"partition": 1, "offset": 0},
    }
