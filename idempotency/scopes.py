"""Scope functions: whose key is it? A stored response is only ever replayed within its scope.

A scope function takes the :class:`RequestInfo` and returns the tenant or principal as a
string (or an awaitable of one); ``None`` or ``""`` means "nobody", and the request gets 400.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from outboxkit.idempotency.asgi import Scope


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What a scope function may look at: method, path, headers (lower-case names), and the
    ASGI scope itself (``asgi_scope["user"]`` after Starlette's AuthenticationMiddleware)."""

    method: str
    path: str
    headers: Mapping[str, str]
    asgi_scope: Scope


ScopeFunction = Callable[[RequestInfo], "str | Awaitable[str | None] | None"]


def header_scope(name: str) -> ScopeFunction:
    """Scope keys by a request header set by a trusted layer, e.g. ``X-Tenant``.

    Only safe when the header cannot be forged by a client (set by a gateway that
    authenticated the caller); otherwise scope by the authenticated principal.
    """
    wanted = name.lower()

    def scope_of(request: RequestInfo) -> str | None:
        return request.headers.get(wanted) or None

    return scope_of


def principal_scope(request: RequestInfo) -> str | None:
    """Scope keys by ``scope["user"]`` (Starlette's authentication): its ``identity``, else its
    ``display_name``; ``None`` when nobody is authenticated."""
    user: Any = request.asgi_scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    identity = getattr(user, "identity", None) or getattr(user, "display_name", None)
    return str(identity) if identity else None
