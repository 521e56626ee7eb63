"""The relay: publishes committed outbox rows to Kafka, in order per key."""

from outboxkit.relay.options import RelayOptions
from outboxkit.relay.runner import Relay, RelayStats

__all__ = ["Relay", "RelayOptions", "RelayStats"]
