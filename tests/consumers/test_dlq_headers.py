"""The dead-letter headers the runtime writes."""

from __future__ import annotations

from outboxkit.consumers import dlq_headers
from outboxkit.consumers.dlq import DeadLetter, dead_letter_headers, dlq_topic_for


def test_dead_letter_headers_replace_earlier_ones_and_keep_the_rest() -> None:
    letter = DeadLetter(
        topic="orders",
        partition=2,
        offset=41,
        timestamp=1_700_000_000_000,
        key=b"k",
        value=b"v",
        headers=[("ce_id", b"1"), (dlq_headers.ERROR_CLASS, b"old"), ("x", None)],
        error_class="permanent:Permanent",
        error_message="m",
        attempts=1,
        first_failure_ms=5,
        last_failure_ms=6,
    )
    headers = dead_letter_headers(letter, "billing")
    assert headers[:2] == [("ce_id", b"1"), ("x", None)]
    facts = dict(headers[2:])
    assert list(facts) == list(dlq_headers.ALL)
    assert facts[dlq_headers.ERROR_CLASS] == b"permanent:Permanent"
    assert facts[dlq_headers.ORIGINAL_OFFSET] == b"41"
    assert dlq_topic_for("{topic}.dlq", "orders") == "orders.dlq"
