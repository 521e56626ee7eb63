"""The ASGI middleware: ``Idempotency-Key`` for POST-like routes, backed by the app's database.

Pure ASGI: it wraps Starlette, FastAPI or any ASGI application. For a route that requires a
key it reads the body, claims the key in a short transaction of its own (``INSERT ... ON
CONFLICT DO NOTHING`` under the unique (scope, key) constraint), and then

- runs the app, buffering its response. If the handler used the request's session
  (:func:`~outboxkit.idempotency.context.idempotency_session`), its changes, its outbox events
  and the stored response commit in ONE transaction; otherwise the response is stored in a
  short transaction after the handler;
- answers 5xx, and 408/409/425/429 ("try again"), without storing them: the work is rolled
  back, the claim released, and a retry executes;
- answers a replay (``Idempotent-Replay: true``), 409 (in progress, ``Retry-After``), 422 (the
  key with another request) or 400 (no key) without running the handler.

See ``docs/http-idempotency.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from outboxkit.idempotency.asgi import ASGIApp, Message, Receive, Scope, Send, header_map
from outboxkit.idempotency.bodies import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    BodyGuard,
    BodyIncompleteError,
    BodyRefusedError,
    body_limit_matcher,
    declared_length,
    read_body,
)
from outboxkit.idempotency.context import CONTEXT_KEY, Decided, IdempotencyContext
from outboxkit.idempotency.metrics import REQUESTS, Outcome
from outboxkit.idempotency.responses import body_too_large
from outboxkit.idempotency.routes import Routes, route_matcher
from outboxkit.idempotency.scopes import ScopeFunction
from outboxkit.idempotency.store import DEFAULT_LEASE_S, DEFAULT_TTL_S, Clock, IdempotencyStore
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

log = logging.getLogger("outboxkit.idempotency")
RETRY_STATUSES = frozenset({408, 409, 425, 429})


def default_store_status(status: int) -> bool:
    """Store every response but 5xx and the "try again" statuses (408, 409, 425, 429)."""
    return status < 500 and status not in RETRY_STATUSES


class IdempotencyMiddleware:
    """Server-side ``Idempotency-Key`` (IETF draft; Stripe's behaviour where it is silent).

    ``routes`` lists the routes that require a key (``"POST /refunds"``, ``"POST
    /orders/{id}/pay"``, ``"PUT /files/*"``, or a predicate of method and path); other routes
    may opt in from inside the app (``outboxkit.idempotency.depends``). ``scope_of`` tells
    whose key it is (a tenant or the authenticated principal): stored responses are only
    replayed within one scope. Give the app's ``engine`` or ``sessions`` (exactly one).
    ``fingerprint_headers`` are header names whose values belong to the request's identity.
    ``ttl_s`` (default 24 h) is how long a key is remembered; ``lease_s`` how long a claim may
    stay in progress before another request may take the key over. ``on_outcome`` is called
    with each :class:`~outboxkit.idempotency.metrics.Outcome` (beside the Prometheus counter).

    Every request body that passes through is bounded: ``max_body_bytes`` (default 1 MiB), or
    the limit of the first matching route of ``body_limits`` (``{"POST /uploads": 50 << 20}``);
    a larger one is refused with 413 before more than the limit is read. A body must be
    complete within ``body_timeout_s`` (default 30 s) of its first read, else 408 and the
    connection closed. A client that disconnects before its body is complete never reaches
    the handler of a route that requires a key, and its key stays unclaimed.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        scope_of: ScopeFunction,
        engine: AsyncEngine | None = None,
        sessions: async_sessionmaker[AsyncSession] | None = None,
        routes: Routes | None = None,
        fingerprint_headers: Sequence[str] = (),
        ttl_s: float = DEFAULT_TTL_S,
        lease_s: float = DEFAULT_LEASE_S,
        retry_after_s: int = 1,
        store_status: Callable[[int], bool] = default_store_status,
        clock: Clock | None = None,
        on_outcome: Callable[[Outcome], None] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        body_limits: Mapping[str, int] | None = None,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        if (engine is None) == (sessions is None):
            raise ValueError("give exactly one of engine= or sessions=")
        self.app = app
        self.scope_of = scope_of
        self.sessions: async_sessionmaker[AsyncSession] = sessions or async_sessionmaker(
            engine, expire_on_commit=False
        )
        self.requires_key = route_matcher(routes)
        self.fingerprint_headers = tuple(fingerprint_headers)
        self.store = IdempotencyStore(ttl_s=ttl_s, lease_s=lease_s, clock=clock)
        self.retry_after_s = max(1, retry_after_s)
        self.store_status = store_status
        self.on_outcome = on_outcome
        if not body_timeout_s > 0:
            raise ValueError("body_timeout_s must be positive")
        self.body_limit = body_limit_matcher(max_body_bytes, body_limits)
        self.body_timeout_s = body_timeout_s

    def count(self, outcome: Outcome) -> None:
        """Count an outcome in the metrics and tell ``on_outcome``."""
        REQUESTS.labels(outcome.value).inc()
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI call."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        context = IdempotencyContext(self, scope)
        scope[CONTEXT_KEY] = context
        limit = self.body_limit(scope["method"], scope["path"])
        declared = declared_length(header_map(scope))
        if declared is not None and declared > limit:  # refused before a byte is read
            self.count(Outcome.BODY_TOO_LARGE)
            await body_too_large(limit).send(send)
            return
        capture = _Capture(context, send)

        def refused_in_app(refused: BodyRefusedError) -> None:
            # read by the app (a route not requiring a key, or opting in): answer 413/408
            # instead of whatever the app makes of the error, unless it has answered already
            if not capture.started and context.decided is None:
                context.decided = refused.answer
                self.count(refused.outcome)

        guard = BodyGuard(receive, limit, self.body_timeout_s, on_refused=refused_in_app)
        receive = guard
        if self.requires_key(scope["method"], scope["path"]):
            try:
                body, receive = await read_body(guard)
            except BodyIncompleteError:
                self.count(Outcome.BODY_INCOMPLETE)
                return  # nobody to answer: the handler does not run, the key stays unclaimed
            except BodyRefusedError:
                assert context.decided is not None
                await context.decided.send(send)
                return
            answer = await context.claim(body)
            if answer is not None:
                await answer.send(send)
                return
        try:
            await self.app(scope, receive, capture.send)
        except BaseException as error:
            if context.decided is None:
                await context.abort()
                raise
            if not isinstance(error, Decided):
                log.warning("the app failed after an idempotency answer: %s", type(error).__name__)
        if context.decided is not None:  # an in-app opt-in said "do not run the handler"
            await context.abort()
            await context.decided.send(send)
            return
        if not context.claimed:
            return  # not an idempotent request: everything went straight through
        if capture.status is None:  # the app returned without answering: the server sends 500
            await context.abort()
            return
        answer = await context.finish(capture.status, capture.headers, b"".join(capture.body))
        await answer.send(send)


class _Capture:
    """Buffers the response of a claimed request; passes any other one straight through."""

    def __init__(self, context: IdempotencyContext, send: Send) -> None:
        self.context = context
        self.downstream = send
        self.passthrough: bool | None = None
        self.started = False  # a response went downstream already
        self.status: int | None = None
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []

    async def send(self, message: Message) -> None:
        if self.context.decided is not None:
            return  # the app's rendering of Decided (a 500): the middleware sends the answer
        if self.passthrough is None and message["type"] == "http.response.start":
            self.passthrough = not self.context.claimed
        if self.passthrough is not False:
            self.started = True
            await self.downstream(message)
            return
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = [
                (n.decode("latin-1"), v.decode("latin-1")) for n, v in message.get("headers", [])
            ]
        elif message["type"] == "http.response.body":
            self.body.append(bytes(message.get("body", b"")))
