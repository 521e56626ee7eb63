"""The consumer runtime: inbox-deduplicated handlers, retries and a dead-letter topic."""

from outboxkit.consumers.app import ConsumerApp, Handler, HandlerSignatureError
from outboxkit.consumers.errors import ConsumerError, NoHandlerError, Permanent, Retryable
from outboxkit.consumers.inbox import purge_inbox
from outboxkit.consumers.records import KafkaRecord
from outboxkit.consumers.retry import RetryPolicy
from outboxkit.consumers.runtime import ConsumerRuntime, Stats
from outboxkit.consumers.tables import inbox_events

__all__ = [
    "ConsumerApp",
    "ConsumerError",
    "ConsumerRuntime",
    "Handler",
    "HandlerSignatureError",
    "KafkaRecord",
    "NoHandlerError",
    "Permanent",
    "RetryPolicy",
    "Retryable",
    "Stats",
    "inbox_events",
    "purge_inbox",
]
