"""The outbox kernel: write a change and its CloudEvent in one transaction, and what every other
outboxkit package shares (tables, engines, the database clock, backoff, retry, errors)."""

from outboxkit.outbox.errors import (
    InvalidEventError,
    OutboxError,
    OutcomeUnknownError,
    PermanentError,
    TransientError,
    UnsupportedDatabaseError,
)
from outboxkit.outbox.events import EncodedEvent, encode_binary, new_event, new_event_id
from outboxkit.outbox.kafka_settings import KafkaSettings, KafkaSettingsError
from outboxkit.outbox.retry import RetryPolicy
from outboxkit.outbox.writer import Outbox

__all__ = [
    "EncodedEvent",
    "InvalidEventError",
    "KafkaSettings",
    "KafkaSettingsError",
    "Outbox",
    "OutboxError",
    "OutcomeUnknownError",
    "PermanentError",
    "RetryPolicy",
    "TransientError",
    "UnsupportedDatabaseError",
    "encode_binary",
    "new_event",
    "new_event_id",
]
