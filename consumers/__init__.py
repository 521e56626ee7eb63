"""The consumer runtime: inbox-deduplicated handlers, retries and a dead-letter topic."""

from consumers.app import ConsumerApp, Handler, HandlerSignatureError
from consumers.errors import ConsumerError, NoHandlerError, Permanent, Retryable
from consumers.inbox import purge_inbox
from consumers.retry import RetryPolicy
from consumers.runtime import ConsumerRuntime, Stats
from consumers.tables import inbox_events

__all__ = [
    "ConsumerApp",
    "ConsumerError",
    "ConsumerRuntime",
    "Handler",
    "HandlerSignatureError",
    "NoHandlerError",
    "Permanent",
    "RetryPolicy",
    "Retryable",
    "Stats",
    "inbox_events",
    "purge_inbox",
]
