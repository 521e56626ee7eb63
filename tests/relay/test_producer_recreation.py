"""Producer errors that cannot be retried in place: an out-of-order sequence number, an unknown
or fenced producer id, a send whose outcome is unknown. The relay replaces the producer (a new
producer id), releases the batch's rows without counting an attempt, and never leaves a gap in
its own sequence numbers after a batch the broker refused. Real Kafka."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RequestTimedOutError,
    UnknownProducerId,
)
from outboxkit.outbox import new_event
from outboxkit.outbox.kafka_failures import producer_lost
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay
from outboxkit.relay.claims import ClaimedRow
from outboxkit.relay.publisher import KafkaUnavailable, Publisher
from outboxkit.testing.kafka import create_topic

from tests.relay.test_refusals import STRICT, create_small_topic, rows_by_state
from tests.relay.test_relay import write_events
from tests.support.kafka import read_topic
from tests.support.waits import scaled


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (OutOfOrderSequenceNumber(), "out-of-order sequence number"),
        (UnknownProducerId(), "unknown producer id"),
        (InvalidProducerEpoch(), "fenced producer (invalid epoch)"),
        (ProducerFenced(), "fenced producer"),
        (KafkaTimeoutError("no acknowledgement within 4.5s"), "outcome unknown"),
        (RequestTimedOutError(), "outcome unknown"),
        (KafkaConnectionError("refused"), None),
        (MessageSizeTooLargeError(), None),
    ],
)
def test_which_errors_leave_a_producer_that_cannot_send_again(
    error: BaseException, cause: str | None
) -> None:
    found = producer_lost(error)
    assert found == cause if cause is None else cause in (found or "")


def publisher(bootstrap: str) -> Publisher:
    return Publisher(
        KafkaSettings(bootstrap=bootstrap),
        request_timeout_s=1.5,
        linger_s=0.0,
        max_batch_bytes=512 * 1024,
        max_request_size=1024 * 1024,
        client_id="outboxkit-test",
    )


def rows(topic: str, first: int, count: int) -> list[ClaimedRow]:
    return [
        ClaimedRow(n, topic, b"k", [("ce_id", f"e-{n}".encode())], f'{{"n": {n}}}'.encode(), 0)
        for n in range(first, first + count)
    ]


async def test_an_out_of_order_sequence_number_recreates_the_producer(
    kafka_bootstrap: str, topic: str
) -> None:
    await create_topic(kafka_bootstrap, topic, 1)
    sender = publisher(kafka_bootstrap)
    try:
        first = await sender.publish(rows(topic, 0, 3))
        assert len(first.published) == 3
        producer = sender._producer
        assert producer is not None
        old_id = producer._txn_manager.producer_id
        # The gap a batch lost inside aiokafka leaves (aiokafka#1017): the broker's real answer
        # to every later batch of this producer is OutOfOrderSequenceNumber.
        producer._txn_manager.increment_sequence_number(TopicPartition(topic, 0), 5)
        stuck = await sender.publish(rows(topic, 3, 3))
        assert isinstance(stuck.outage, OutOfOrderSequenceNumber)
        assert stuck.failed == [] and [row.id for row in stuck.released] == [3, 4, 5]

        raised = await sender.recreate(stuck.outage)

        assert isinstance(raised, KafkaUnavailable)
        assert "out-of-order sequence number" in str(raised) and "recreated" in str(raised)
        again = await sender.publish(rows(topic, 3, 3))
        assert [row.id for row in again.published] == [3, 4, 5]
        assert sender._producer is not None
        assert sender._producer._txn_manager.producer_id != old_id
        assert sender.recreated == 1
    finally:
        await sender.stop()
    records = await read_topic(kafka_bootstrap, topic, expected=6)
    assert [record.value for record in records] == [f'{{"n": {n}}}'.encode() for n in range(6)]


async def test_a_batch_refused_as_too_large_leaves_no_gap_in_the_producers_sequence(
    sqlite_url: str, kafka_bootstrap: str, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: aiokafka kept the refused batch's sequence numbers, the smaller batches sent
    # next met OutOfOrderSequenceNumber, and the relay went through an outage (a WARNING, a
    # backoff and a new producer) after every refusal.
    # The broker checks sequences only for a producer it knows: five small rows go first.
    await create_small_topic(kafka_bootstrap, topic, 20_000)
    events = [
        new_event(
            "a", "/s", {"n": n, "pad": "x" * (5000 if n >= 5 else 0)}, partitionkey=f"k{n % 5}"
        )
        for n in range(30)
    ]
    write_events(sqlite_url, topic, events)
    options = replace(STRICT, batch_size=5)  # 5 padded rows: 25 kB, refused; split, they fit

    with caplog.at_level(logging.INFO, logger="outboxkit.relay"):
        await Relay(
            db_url=sqlite_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=options
        ).drain(timeout_s=scaled(60))

    published, parked = rows_by_state(sqlite_url)
    assert parked == [] and dict(published) == {f"k{k}": [0] * 6 for k in range(5)}
    said = [record.getMessage() for record in caplog.records]
    assert [line for line in said if "refused a batch" in line], said
    assert not [line for line in said if "unavailable" in line or "OutOfOrder" in line], said
    assert len(await read_topic(kafka_bootstrap, topic, expected=30)) == 30
