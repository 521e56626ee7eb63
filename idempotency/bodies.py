"""Reading request bodies with a size limit and a deadline, and telling a complete body from a
client that went away.

A body is complete only when the server says so (``more_body`` false, which for a declared
``Content-Length`` means every byte arrived). ``http.disconnect`` before that is not the end of
the body: the request never reaches the handler and claims nothing, so the client's retry with
the whole body and the same key executes. A body larger than its limit is refused with 413 as
soon as that is known (a declared ``Content-Length`` before any byte is read, a chunked body
as it crosses the limit), so at most ``limit`` bytes of it are ever held; one that does not
arrive within the deadline is refused with 408 and the connection closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import NoReturn

from outboxkit.idempotency.asgi import Message, Receive
from outboxkit.idempotency.context import Decided
from outboxkit.idempotency.metrics import Outcome
from outboxkit.idempotency.responses import Answer, body_timeout, body_too_large
from outboxkit.idempotency.routes import route_matcher

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_BODY_TIMEOUT_S = 30.0


class BodyIncompleteError(Exception):
    """The client disconnected before the request body was complete."""


class BodyRefusedError(Decided):
    """The body is too large (413) or too slow (408): ``answer`` is sent instead of the app's."""

    def __init__(self, answer: Answer, outcome: Outcome) -> None:
        super().__init__(answer)
        self.outcome = outcome


def body_limit_matcher(
    default: int, per_route: Mapping[str, int] | None
) -> Callable[[str, str], int]:
    """The body limit in bytes of ``(method, path)``: the first route of ``per_route`` (specs as
    in ``routes=``: ``"POST /uploads"``, ``"PUT /files/*"``) that matches, else ``default``."""
    if default <= 0 or any(limit <= 0 for limit in (per_route or {}).values()):
        raise ValueError("body limits must be positive numbers of bytes")
    matchers = [(route_matcher([spec]), limit) for spec, limit in (per_route or {}).items()]

    def limit_of(method: str, path: str) -> int:
        return next((limit for match, limit in matchers if match(method, path)), default)

    return limit_of


def declared_length(headers: Mapping[str, str]) -> int | None:
    """The request's ``Content-Length``, or ``None`` (chunked, absent or unreadable)."""
    raw = headers.get("content-length", "").strip()
    return int(raw) if raw.isdigit() else None


class BodyGuard:
    """A ``receive`` that enforces the body's size limit and its deadline.

    The deadline counts from the first read of the body; it ends when the body is complete.
    After that, messages (the ``http.disconnect`` an app may wait for) pass through unbounded.
    ``on_refused`` is told before it raises :class:`BodyRefusedError`, when the body crosses
    ``limit`` bytes or is not complete within ``timeout_s`` seconds.
    """

    def __init__(
        self,
        receive: Receive,
        limit: int,
        timeout_s: float,
        on_refused: Callable[[BodyRefusedError], None] | None = None,
    ) -> None:
        self._receive = receive
        self._on_refused = on_refused
        self.limit = limit
        self.timeout_s = timeout_s
        self.received = 0
        self.complete = False
        self._deadline: float | None = None

    async def __call__(self) -> Message:
        if self.complete:
            return await self._receive()
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + self.timeout_s
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            self._refuse(BodyRefusedError(body_timeout(self.timeout_s), Outcome.BODY_TIMEOUT))
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self._refuse(BodyRefusedError(body_too_large(self.limit), Outcome.BODY_TOO_LARGE))
            if not message.get("more_body", False):
                self.complete = True
        return message

    def _refuse(self, refused: BodyRefusedError) -> NoReturn:
        if self._on_refused is not None:
            self._on_refused(refused)
        raise refused


async def read_body(guard: BodyGuard) -> tuple[bytes, Receive]:
    """Read the whole body through ``guard``; return it and a ``receive`` that plays it to the
    app (then hands on to the server's, for ``http.disconnect``).

    Raises :class:`BodyIncompleteError` when the client went away first, and
    :class:`BodyRefusedError` for a body over its limit or past its deadline.
    """
    chunks: list[bytes] = []
    while not guard.complete:
        message = await guard()
        if message["type"] != "http.request":
            raise BodyIncompleteError("the client disconnected before the body was complete")
        chunks.append(message.get("body", b""))
    body = b"".join(chunks)
    played = False

    async def replay() -> Message:
        nonlocal played
        if not played:
            played = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await guard()

    return body, replay
