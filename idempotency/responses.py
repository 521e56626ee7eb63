"""The middleware's own answers, as RFC 9457 problem details (``application/problem+json``).

They never echo the key, the body or header values: only which part of a request differed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from outboxkit.idempotency.asgi import Send, send_response
from outboxkit.idempotency.store import StoredResponse

REPLAY_HEADER = "idempotent-replay"


@dataclass(frozen=True, slots=True)
class Answer:
    """A complete response the middleware sends instead of running the handler."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    async def send(self, send: Send) -> None:
        """Send it."""
        await send_response(send, self.status, self.headers, self.body)


def problem(status: int, title: str, detail: str, **extra: object) -> Answer:
    """A problem-details answer."""
    document = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    body = json.dumps(document, separators=(",", ":")).encode()
    headers = [("content-type", "application/problem+json"), ("content-length", str(len(body)))]
    return Answer(status, headers, body)


def missing_key() -> Answer:
    """400: the route requires an ``Idempotency-Key``."""
    return problem(
        400, "Idempotency-Key missing", "This endpoint requires an Idempotency-Key header."
    )


def invalid_key(reason: str) -> Answer:
    """400: the header is not a usable key."""
    return problem(400, "Idempotency-Key invalid", reason)


def no_scope() -> Answer:
    """400: the scope function found nobody to scope the key to."""
    return problem(
        400, "Idempotency-Key not scoped", "The request does not say whose Idempotency-Key it is."
    )


def conflict(differing: Sequence[str]) -> Answer:
    """422: the key was used with another request."""
    parts = ", ".join(differing) or "request"
    return problem(
        422,
        "Idempotency-Key reused",
        f"This Idempotency-Key was used with a different request (differs: {parts}).",
        differs=list(differing),
    )


def in_progress(retry_after_s: int) -> Answer:
    """409 with ``Retry-After``: the first request with this key is still running."""
    answer = problem(
        409, "Request in progress", "A request with this Idempotency-Key is still being processed."
    )
    return _with_retry_after(answer, retry_after_s)


def lease_lost(retry_after_s: int) -> Answer:
    """409: this request outlived its claim and another took the key over; nothing committed."""
    answer = problem(
        409,
        "Request superseded",
        "This request ran longer than its claim on the Idempotency-Key; its work was rolled "
        "back. Retry to get the result of the request that took the key over.",
    )
    return _with_retry_after(answer, retry_after_s)


def body_too_large(limit: int) -> Answer:
    """413: the request body is larger than the route accepts; the connection is closed."""
    answer = problem(
        413, "Content too large", f"The request body is larger than this endpoint's {limit} bytes."
    )
    return Answer(answer.status, [*answer.headers, ("connection", "close")], answer.body)


def body_timeout(timeout_s: float) -> Answer:
    """408: the request body did not arrive in time; the connection is closed."""
    answer = problem(
        408, "Request timeout", f"The request body was not complete within {timeout_s:g} s."
    )
    return Answer(answer.status, [*answer.headers, ("connection", "close")], answer.body)


def _with_retry_after(answer: Answer, retry_after_s: int) -> Answer:
    headers = [*answer.headers, ("retry-after", str(retry_after_s))]
    return Answer(answer.status, headers, answer.body)


def replay(stored: StoredResponse) -> Answer:
    """The stored response, byte for byte, marked ``Idempotent-Replay: true``."""
    headers = [(n, v) for n, v in stored.headers if n.lower() != REPLAY_HEADER]
    return Answer(stored.status, [*headers, (REPLAY_HEADER, "true")], stored.body)
