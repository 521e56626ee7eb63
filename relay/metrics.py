"""Prometheus metrics of the relay (served with ``outboxkit relay --metrics-port``).

Counts and ages only: no label holds an event id, a key or any payload.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PUBLISHED = Counter("outboxkit_relay_published", "Outbox rows acknowledged by Kafka.")
PUBLISH_ERRORS = Counter(
    "outboxkit_relay_publish_errors",
    "Rows whose publish failed: kind=record (counts an attempt) or kind=outage (released).",
    ["kind"],
)
PRODUCERS_RECREATED = Counter(
    "outboxkit_relay_producers_recreated",
    "Kafka producers replaced after an outage: cause=state_lost (out-of-order sequence, unknown "
    "or fenced producer id, unknown outcome) or cause=unavailable.",
    ["cause"],
)
PARKED_NOW = Counter("outboxkit_relay_parked", "Rows this relay parked after their last attempt.")
BACKLOG = Gauge("outboxkit_outbox_backlog", "Outbox rows due and neither published nor parked.")
OLDEST_AGE = Gauge(
    "outboxkit_outbox_oldest_unpublished_age_seconds",
    "Age of the oldest due row neither published nor parked, from its due time (0: none).",
)
SCHEDULED = Gauge(
    "outboxkit_outbox_scheduled_rows", "Outbox rows scheduled for later (not backlog yet)."
)
PARKED = Gauge("outboxkit_outbox_parked_rows", "Parked outbox rows waiting for an operator.")
BATCH_SIZE = Histogram(
    "outboxkit_relay_batch_size",
    "Rows per claimed batch.",
    buckets=(1, 5, 10, 25, 50, 100, 200, 500, 1000, 2000, 5000),
)
PUBLISH_SECONDS = Histogram(
    "outboxkit_relay_publish_seconds",
    "Seconds from handing a batch to the producer to its last acknowledgement.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
WAL_MESSAGE_GAPS = Gauge(
    "outboxkit_relay_wal_message_gaps",
    "WAL ranges whose outbox WAL messages were lost with a slot (a failover, a dropped or "
    "invalidated slot), not yet acknowledged (outboxkit outbox gaps --ack).",
)
WAL_MESSAGE_GAP_LOST = Gauge(
    "outboxkit_relay_wal_message_gap_lost_events",
    "Outbox WAL message events known lost in the unacknowledged gaps (counted in the WAL).",
)
