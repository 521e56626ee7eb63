"""outboxkit: change your database and tell the world about it, with no event lost and no
effect applied twice.

The names a service needs are here; each subpackage has its own job (see the README's layout):
``outboxkit.outbox`` writes events, ``outboxkit.relay`` publishes them, ``outboxkit.consumers``
applies them once, ``outboxkit.actions`` runs an agent's side effects at most once,
``outboxkit.ops`` and ``outboxkit.cli`` serve operators, ``outboxkit.testing`` serves test suites.
"""

from outboxkit.actions import ActionStore, State, operation_key, run_action
from outboxkit.consumers import ConsumerApp, ConsumerRuntime, ConsumerStats, KafkaRecord
from outboxkit.migrations import upgrade
from outboxkit.outbox import (
    InvalidEventError,
    KafkaSettings,
    Outbox,
    OutboxError,
    OutcomeUnknownError,
    PermanentError,
    RetryPolicy,
    TransientError,
    new_event,
    new_event_id,
)
from outboxkit.relay import Relay, RelayOptions, RelayStats

__all__ = [
    "ActionStore",
    "ConsumerApp",
    "ConsumerRuntime",
    "ConsumerStats",
    "InvalidEventError",
    "KafkaRecord",
    "KafkaSettings",
    "Outbox",
    "OutboxError",
    "OutcomeUnknownError",
    "PermanentError",
    "Relay",
    "RelayOptions",
    "RelayStats",
    "RetryPolicy",
    "State",
    "TransientError",
    "new_event",
    "new_event_id",
    "operation_key",
    "run_action",
    "upgrade",
]
