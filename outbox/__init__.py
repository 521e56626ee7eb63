"""outboxkit: write a change and its CloudEvent in one transaction; relay, consume, act once."""

from outboxkit.outbox.errors import InvalidEventError, OutboxError, UnsupportedDatabaseError
from outboxkit.outbox.events import EncodedEvent, encode_binary, new_event, new_event_id
from outboxkit.outbox.writer import Outbox

__all__ = [
    "EncodedEvent",
    "InvalidEventError",
    "Outbox",
    "OutboxError",
    "UnsupportedDatabaseError",
    "encode_binary",
    "new_event",
    "new_event_id",
]
