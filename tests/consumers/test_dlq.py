"""Dead-letter delivery helpers that need no broker."""

from __future__ import annotations

from aiokafka import ConsumerRecord
from outboxkit.consumers import dlq_headers
from outboxkit.consumers.dlq import (
    DEFAULT_DLQ_TOPIC,
    TRUNCATED_VALUE_BYTES,
    DeadLetter,
    dlq_topic_for,
    shrunk,
)
from outboxkit.consumers.dlq_headers import header_texts


def test_the_dead_letter_topic_is_the_pattern_with_the_topic_filled_in() -> None:
    assert dlq_topic_for(DEFAULT_DLQ_TOPIC, "orders") == "orders.dlq"
    assert dlq_topic_for("dead.{topic}.v1", "orders") == "dead.orders.v1"


LETTER = DeadLetter(
    topic="orders",
    partition=0,
    offset=7,
    timestamp=1,
    key=b"k",
    value=b"v" * 200_000,
    headers=(("ce_id", b"1"), ("big", b"h" * 20_000), ("after", b"x")),
    error_class="permanent:InvalidJSONError",
    error_message="m",
    attempts=1,
    first_failure_ms=2,
    last_failure_ms=3,
)


def test_a_refused_letter_is_cut_down_step_by_step_and_says_what_was_left_out() -> None:
    assert shrunk(LETTER, 0) is LETTER
    first = shrunk(LETTER, 1)
    assert first.value == b"v" * TRUNCATED_VALUE_BYTES and first.headers == LETTER.headers
    assert (first.truncated, first.original_size, first.key) == ("value", 200_000, b"k")
    second = shrunk(LETTER, 2)
    # No value; original headers up to the first one past the budget; the key stays.
    assert second.value is None and second.headers == (("ce_id", b"1"),)
    assert (second.truncated, second.original_size, second.key) == ("value,headers", 200_000, b"k")
    third = shrunk(LETTER, 3)
    assert (third.value, third.headers, third.key) == (None, (), None)
    assert third.truncated == "value,headers,key"


def test_truncation_facts_travel_in_headers_and_read_back() -> None:
    headers = shrunk(LETTER, 2).to_headers("billing")
    texts = header_texts(headers)
    assert texts[dlq_headers.TRUNCATED] == "value,headers"
    assert texts[dlq_headers.ORIGINAL_SIZE] == "200000"
    record = ConsumerRecord("orders.dlq", 0, 0, 0, 0, b"k", None, None, 0, 0, headers)
    back = DeadLetter.from_record(record)
    assert (back.truncated, back.original_size) == ("value,headers", 200_000)
    # A record dead-lettered again gets fresh facts: old truncation headers are not kept.
    assert shrunk(LETTER, 0).to_headers("billing") == LETTER.to_headers("billing")
    assert dlq_headers.TRUNCATED not in header_texts(
        DeadLetter.from_record(record).original_headers()
    )
