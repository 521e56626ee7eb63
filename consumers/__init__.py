"""The consumer runtime: inbox-deduplicated handlers, retries and a dead-letter topic.

Handlers raise ``TransientError`` / ``PermanentError`` and retries follow a ``RetryPolicy``:
the kernel's vocabulary, imported from :mod:`outboxkit.outbox`.
"""

from outboxkit.consumers.app import ConsumerApp, Handler, HandlerSignatureError
from outboxkit.consumers.errors import ConsumerError, NoHandlerError
from outboxkit.consumers.inbox import purge_inbox
from outboxkit.consumers.metrics import ConsumerStats
from outboxkit.consumers.records import KafkaRecord
from outboxkit.consumers.runtime import ConsumerRuntime
from outboxkit.consumers.tables import inbox_events

__all__ = [
    "ConsumerApp",
    "ConsumerError",
    "ConsumerRuntime",
    "ConsumerStats",
    "Handler",
    "HandlerSignatureError",
    "KafkaRecord",
    "NoHandlerError",
    "inbox_events",
    "purge_inbox",
]
