"""``dlq replay`` and dead letters cut down to fit: refused, replayed from the original record
while its topic retains it, or replayed as cut under a new id. Real Kafka: the dead-letter topic
refuses the whole letter (max.message.bytes 100,000), and the publisher cuts its value."""

from __future__ import annotations

import time

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.structs import ConsumerRecord
from outboxkit.consumers import dlq_headers
from outboxkit.consumers.dlq import (
    TRUNCATED_VALUE_BYTES,
    DeadLetterPublisher,
    dead_letter_for,
)
from outboxkit.outbox import new_event
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.testing.kafka import create_topic

from tests.support.consumers import binary_record, produce
from tests.support.kafka import read_topic
from tests.support.ops import cli

BIG = 150_000


def headers_of(record: ConsumerRecord) -> dict[str, bytes]:
    return {name: value or b"" for name, value in record.headers}


async def dead_letter_a_big_event(bootstrap: str, topic: str) -> tuple[str, bytes]:
    """A 150 kB event on ``topic``, dead-lettered to ``topic.dlq``, which only takes 100 kB."""
    dlq = f"{topic}.dlq"
    await create_topic(bootstrap, topic)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(dlq, 1, 1, topic_configs={"max.message.bytes": "100000"})]
        )
    finally:
        await admin.close()
    event = new_event("big.thing", "/tests/big", {"blob": "b" * BIG}, id="big-1")
    await produce(bootstrap, topic, [binary_record(event)])
    [original] = await read_topic(bootstrap, topic, expected=1)
    now = time.time_ns() // 1_000_000
    letter = dead_letter_for(original, "permanent", ValueError("refused"), 1, now, now)
    publisher = DeadLetterPublisher(KafkaSettings(bootstrap=bootstrap), "billing")
    await publisher.start()
    try:
        await publisher.publish([letter])
    finally:
        await publisher.stop()
    [cut] = await read_topic(bootstrap, dlq, expected=1)
    assert headers_of(cut)[dlq_headers.TRUNCATED] == b"value"
    assert len(cut.value) == TRUNCATED_VALUE_BYTES
    return dlq, original.value


async def test_a_truncated_letter_is_refused_or_replayed_from_its_original(
    sqlite_url: str, kafka_bootstrap: str, topic: str
) -> None:
    dlq, value = await dead_letter_a_big_event(kafka_bootstrap, topic)
    common = ("--bootstrap", kafka_bootstrap, "--db-url", sqlite_url, "--by", "tester")

    # Before: republished the 64 KiB cut as event big-1 itself, and the real one became a dup.
    refused = await cli("dlq", "replay", dlq, *common)
    assert refused.code == 2, refused.err
    line = refused.error_line()
    assert f"{dlq}[0]@0 is a truncated dead letter" in line and f"{topic}[0]@0" in line
    dry = await cli("dlq", "replay", dlq, "--dry-run", *common)
    assert dry.code == 2 and "--fetch-original" in dry.error_line()
    assert len(await read_topic(kafka_bootstrap, topic, expected=1, timeout=10)) == 1

    both = await cli("dlq", "replay", dlq, "--fetch-original", "--allow-truncated", *common)
    assert both.code == 2 and "not both" in both.error_line()

    fetched = await cli("dlq", "replay", dlq, "--fetch-original", "--json", *common)
    assert fetched.code == 0, fetched.err
    assert fetched.json()["replayed"] == 1
    records = await read_topic(kafka_bootstrap, topic, expected=2)
    assert len(records) == 2
    assert records[1].value == value and len(value) > BIG  # the whole event, as first produced
    assert headers_of(records[1])["ce_id"] == b"big-1"
    assert dlq_headers.TRUNCATED not in headers_of(records[1])

    marked = await cli("dlq", "replay", dlq, "--allow-truncated", "--force", *common)
    assert marked.code == 0, marked.err
    records = await read_topic(kafka_bootstrap, topic, expected=3)
    assert len(records) == 3
    cut = headers_of(records[2])
    assert cut["ce_id"].startswith(b"truncated-") and cut["outboxkit-original-id"] == b"big-1"
    assert cut[dlq_headers.TRUNCATED] == b"value"
    assert cut[dlq_headers.ORIGINAL_SIZE] == str(len(value)).encode()
    assert records[2].value == value[:TRUNCATED_VALUE_BYTES]


async def test_an_original_no_longer_retained_is_refused(
    sqlite_url: str, kafka_bootstrap: str, topic: str
) -> None:
    dlq, _ = await dead_letter_a_big_event(kafka_bootstrap, topic)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:  # what retention does to an old segment
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(before_offset=1)})
    finally:
        await admin.close()
    common = ("--bootstrap", kafka_bootstrap, "--db-url", sqlite_url, "--by", "tester")
    gone = await cli("dlq", "replay", dlq, "--fetch-original", *common)
    assert gone.code == 2, gone.err
    assert "no longer retained" in gone.error_line() and "--allow-truncated" in gone.error_line()
