"""Server-side ``Idempotency-Key`` for HTTP APIs that agents (and people) call.

:class:`IdempotencyMiddleware` (pure ASGI) claims each key in the application's database
before the handler runs; with :func:`idempotency_session` (or the FastAPI dependency in
:mod:`outboxkit.idempotency.depends`) the handler's change, its outbox events and the stored
response commit in one transaction. See ``docs/http-idempotency.md``.
"""

from outboxkit.idempotency.cleanup import purge_expired
from outboxkit.idempotency.context import (
    IdempotencyContext,
    IdempotencyError,
    context_of,
    idempotency_session,
)
from outboxkit.idempotency.metrics import Outcome
from outboxkit.idempotency.middleware import IdempotencyMiddleware, default_store_status
from outboxkit.idempotency.scopes import RequestInfo, header_scope, principal_scope
from outboxkit.idempotency.store import ClaimKind, IdempotencyStore, KeyRecord

__all__ = [
    "ClaimKind",
    "IdempotencyContext",
    "IdempotencyError",
    "IdempotencyMiddleware",
    "IdempotencyStore",
    "KeyRecord",
    "Outcome",
    "RequestInfo",
    "context_of",
    "default_store_status",
    "header_scope",
    "idempotency_session",
    "principal_scope",
    "purge_expired",
]
