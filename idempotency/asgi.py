"""The ASGI types the middleware uses, and small message helpers (no framework needed)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def send_response(
    send: Send, status: int, headers: Sequence[tuple[str, str]], body: bytes
) -> None:
    """Send a complete response."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def header_map(scope: Scope) -> dict[str, str]:
    """Request headers by lower-case name (repeated headers joined with ``, ``)."""
    found: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        found[name] = f"{found[name]}, {value}" if name in found else value
    return found
