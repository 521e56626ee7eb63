"""The dead-letter record format: what the runtime writes is what the tools read back."""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka import ConsumerRecord
from outboxkit.consumers import dlq_headers
from outboxkit.consumers.dlq_headers import DeadLetter, Header


def consumed(
    key: bytes | None, value: bytes | None, headers: Sequence[Header]
) -> ConsumerRecord[bytes, bytes]:
    """A record of a dead-letter topic as a consumer hands it out."""
    return ConsumerRecord(
        topic="orders.dlq",
        partition=0,
        offset=7,
        timestamp=1_700_000_000_500,
        timestamp_type=0,
        key=key,
        value=value,
        checksum=None,
        serialized_key_size=len(key or b""),
        serialized_value_size=len(value or b""),
        headers=headers,
    )


def written(letter: DeadLetter, group: str) -> ConsumerRecord[bytes, bytes]:
    """``letter`` as the runtime writes it to the dead-letter topic."""
    return consumed(letter.key, letter.value, letter.to_headers(group))


LETTER = DeadLetter(
    topic="orders",
    partition=2,
    offset=41,
    timestamp=1_700_000_000_000,
    key=b"k",
    value=b"v",
    headers=[("ce_id", b"1"), (dlq_headers.ERROR_CLASS, b"old"), ("x", None)],
    error_class="permanent:PermanentError",
    error_message="m",
    attempts=1,
    first_failure_ms=5,
    last_failure_ms=6,
)


def test_dead_letter_headers_replace_earlier_ones_and_keep_the_rest() -> None:
    headers = LETTER.to_headers("billing")
    assert headers[:2] == [("ce_id", b"1"), ("x", None)]
    facts = dict(headers[2:])
    assert list(facts) == list(dlq_headers.ALL)
    assert facts[dlq_headers.ERROR_CLASS] == b"permanent:PermanentError"
    assert facts[dlq_headers.ORIGINAL_OFFSET] == b"41"
    assert facts[dlq_headers.CONSUMER_GROUP] == b"billing"


def test_a_letter_read_back_has_the_facts_it_was_written_with() -> None:
    back = DeadLetter.from_record(written(LETTER, "billing"))
    assert back.consumer_group == "billing"
    assert back.original_headers() == [("ce_id", b"1"), ("x", None)]
    assert (back.topic, back.partition, back.offset, back.timestamp) == (
        "orders",
        2,
        41,
        1_700_000_000_000,
    )
    assert (back.error_class, back.error_message, back.attempts) == (
        "permanent:PermanentError",
        "m",
        1,
    )
    assert (back.first_failure_ms, back.last_failure_ms, back.key, back.value) == (5, 6, b"k", b"v")
    # Written again (it failed after a replay): the same headers, not a second set of facts.
    assert back.to_headers("billing") == LETTER.to_headers("billing")


def test_long_messages_are_cut_and_missing_facts_have_no_header() -> None:
    letter = DeadLetter(
        topic="orders",
        partition=0,
        offset=1,
        timestamp=2,
        key=None,
        value=None,
        headers=(),
        error_class="exhausted:KeyError",
        error_message="x" * 1000,
        attempts=None,
        first_failure_ms=None,
        last_failure_ms=None,
    )
    facts = dict(letter.to_headers("g"))
    assert len(facts[dlq_headers.ERROR_MESSAGE] or b"") == 300
    assert dlq_headers.ATTEMPTS not in facts and dlq_headers.FIRST_FAILURE_MS not in facts


def test_a_record_without_readable_facts_reads_as_none_not_an_error() -> None:
    found = [
        (dlq_headers.ORIGINAL_OFFSET, b"forty-one"),
        (dlq_headers.ATTEMPTS, b"\xff"),
        (dlq_headers.ORIGINAL_TOPIC, b""),
    ]
    back = DeadLetter.from_record(consumed(None, b"{}", found))
    assert (back.topic, back.offset, back.attempts, back.error_class) == (None, None, None, None)
