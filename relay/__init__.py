"""The relay: publishes committed outbox rows to Kafka, in order per key."""

from outboxkit.outbox.errors import NotMigratedError
from outboxkit.relay.options import RelayOptions
from outboxkit.relay.runner import Relay, RelayStats

__all__ = ["NotMigratedError", "Relay", "RelayOptions", "RelayStats"]
