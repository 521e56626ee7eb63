"""Dead-letter delivery helpers that need no broker."""

from __future__ import annotations

from outboxkit.consumers.dlq import DEFAULT_DLQ_TOPIC, dlq_topic_for


def test_the_dead_letter_topic_is_the_pattern_with_the_topic_filled_in() -> None:
    assert dlq_topic_for(DEFAULT_DLQ_TOPIC, "orders") == "orders.dlq"
    assert dlq_topic_for("dead.{topic}.v1", "orders") == "dead.orders.v1"
