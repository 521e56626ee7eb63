"""The relay: publishes committed outbox rows to Kafka, in order per key."""

from relay.options import RelayOptions
from relay.runner import Relay, RelayStats

__all__ = ["Relay", "RelayOptions", "RelayStats"]
