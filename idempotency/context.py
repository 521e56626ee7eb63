"""One request's idempotency: its key and scope, its claim, the handler's session, the finish.

The middleware puts an :class:`IdempotencyContext` into the ASGI scope of every HTTP request
(:func:`context_of` finds it). On a route that requires a key the middleware claims before the
app runs; a route may also opt in from inside the app (the FastAPI dependency) by calling
:meth:`IdempotencyContext.claim` before its handler runs.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING

from outboxkit.idempotency.asgi import Scope, header_map
from outboxkit.idempotency.fingerprint import fingerprint
from outboxkit.idempotency.keys import HEADER, InvalidKeyError, parse_key
from outboxkit.idempotency.metrics import Outcome
from outboxkit.idempotency.responses import (
    Answer,
    conflict,
    in_progress,
    invalid_key,
    lease_lost,
    missing_key,
    no_scope,
    replay,
)
from outboxkit.idempotency.scopes import RequestInfo
from outboxkit.idempotency.store import ClaimKind, Lease
from outboxkit.outbox.secrecy import describe_error
from outboxkit.outbox.unreachable import database_unreachable, retry_while_unreachable
from sqlalchemy.ext.asyncio import AsyncSession

if TYPE_CHECKING:
    from outboxkit.idempotency.middleware import IdempotencyMiddleware

CONTEXT_KEY = "outboxkit.idempotency"
log = logging.getLogger("outboxkit.idempotency")


class IdempotencyError(RuntimeError):
    """The idempotency machinery is used wrongly (no middleware, no claimed key)."""

    outboxkit_safe_message = True  # its messages are written by outboxkit (outbox/secrecy.py)


class Decided(Exception):
    """Raised from inside the app when a claim says "do not run the handler": the middleware
    sends ``answer`` (a replay, 400, 409 or 422) instead of whatever the app's error handling
    made of the exception (Starlette's ServerErrorMiddleware answers 500 and re-raises)."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.status)
        self.answer = answer


def context_of(scope: Scope) -> IdempotencyContext:
    """The request's context; raises :class:`IdempotencyError` without the middleware."""
    context = scope.get(CONTEXT_KEY)
    if not isinstance(context, IdempotencyContext):
        raise IdempotencyError("no IdempotencyMiddleware around this app")
    return context


async def idempotency_session(scope: Scope) -> AsyncSession:
    """The session of the request's transaction (see :meth:`IdempotencyContext.session`)."""
    return await context_of(scope).session()


class IdempotencyContext:
    """The idempotency state of one request."""

    def __init__(self, middleware: IdempotencyMiddleware, scope: Scope) -> None:
        self._middleware = middleware
        self._scope = scope
        self.key: str | None = None
        self.scope_value: str | None = None
        self.lease: Lease | None = None
        self.decided: Answer | None = None  # an in-app opt-in's answer instead of the handler
        self._session: AsyncSession | None = None

    @property
    def claimed(self) -> bool:
        """This request holds the key and runs its handler."""
        return self.lease is not None

    async def claim(self, body: bytes) -> Answer | None:
        """Claim the request's key; ``None`` to run the handler, else the answer to send.

        Idempotent within a request: a second call after a successful claim returns ``None``.
        """
        if self.lease is not None:
            return None
        middleware = self._middleware
        scope = self._scope
        headers = header_map(scope)
        raw = headers.get(HEADER)
        if raw is None:
            return self._refused(Outcome.MISSING_KEY, missing_key())
        try:
            key = parse_key(raw)
        except InvalidKeyError as error:
            return self._refused(Outcome.MISSING_KEY, invalid_key(describe_error(error)))
        info = RequestInfo(scope["method"], scope["path"], headers, scope)
        found = middleware.scope_of(info)
        owner = await found if inspect.isawaitable(found) else found
        if not owner:
            return self._refused(Outcome.MISSING_KEY, no_scope())
        request = fingerprint(
            scope["method"],
            scope.get("root_path", "") + scope["path"],
            scope.get("query_string", b""),
            body,
            scope.get("headers", []),
            middleware.fingerprint_headers,
        )
        async with middleware.sessions() as session, session.begin():
            claim = await middleware.store.claim(session, owner, key, request)
        self.key, self.scope_value = key, owner
        if claim.kind is ClaimKind.EXECUTE:
            self.lease = claim.lease
            return None
        if claim.kind is ClaimKind.REPLAY:
            assert claim.response is not None
            return self._refused(Outcome.REPLAYED, replay(claim.response))
        if claim.kind is ClaimKind.CONFLICT:
            return self._refused(Outcome.CONFLICT, conflict(claim.differing))
        retry_after = min(claim.retry_after_s, middleware.retry_after_s)
        return self._refused(Outcome.IN_PROGRESS, in_progress(retry_after))

    async def claim_or_raise(self, body: bytes) -> None:
        """:meth:`claim`, raising :class:`Decided` when the handler must not run."""
        answer = await self.claim(body)
        if answer is not None:
            self.decided = answer
            raise Decided(answer)

    async def session(self) -> AsyncSession:
        """The handler's session, in the transaction that will also complete the key.

        Write the effect and its outbox events with it and never commit it: the middleware
        commits the handler's work together with the stored response, or rolls both back.
        """
        if self.lease is None:
            raise IdempotencyError("this request holds no Idempotency-Key claim")
        if self._session is None:
            session = self._middleware.sessions()
            await session.begin()
            self._session = session
        return self._session

    def _refused(self, outcome: Outcome, answer: Answer) -> Answer:
        self._middleware.count(outcome)
        return answer

    async def finish(self, status: int, headers: list[tuple[str, str]], body: bytes) -> Answer:
        """Complete or release the claim after the handler answered; return what to send."""
        middleware = self._middleware
        lease = self.lease
        assert lease is not None
        try:
            if not middleware.store_status(status):
                await self._release()
                middleware.count(Outcome.RELEASED)
                return Answer(status, headers, body)
            session = self._session
            if session is None:
                async with middleware.sessions() as own, own.begin():
                    completed = await middleware.store.complete(own, lease, status, headers, body)
                if not completed:  # the work is done and cannot be undone: say so, answer
                    log.warning("a request outlived its idempotency lease; its key was taken over")
                    middleware.count(Outcome.LEASE_LOST)
                else:
                    middleware.count(Outcome.EXECUTED)
                return Answer(status, headers, body)
            if not session.in_transaction():
                log.error("the handler ended the idempotency transaction itself; not atomic")
            try:
                completed = await middleware.store.complete(session, lease, status, headers, body)
                if not completed:
                    await session.rollback()
                    middleware.count(Outcome.LEASE_LOST)
                    return lease_lost(middleware.retry_after_s)
                await session.commit()
            except BaseException:  # the work is rolled back: let the retry execute
                await self._release()
                raise
            middleware.count(Outcome.EXECUTED)
            return Answer(status, headers, body)
        finally:
            await self._close()

    async def abort(self) -> None:
        """The handler failed: roll its work back and release the claim (best effort: a claim
        that cannot be released now becomes claimable when its lease ends)."""
        if self.lease is None:
            return
        try:
            await self._release()
            self._middleware.count(Outcome.RELEASED)
        except Exception as error:
            log.warning("could not release an idempotency claim: %s", type(error).__name__)
        finally:
            await self._close()

    async def _release(self) -> None:
        if self._session is not None:
            try:
                await self._session.rollback()
            except Exception as error:  # a lost connection rolled the work back already
                if not database_unreachable(error):
                    raise
        lease = self.lease
        assert lease is not None

        async def release() -> None:
            async with self._middleware.sessions() as own, own.begin():
                await self._middleware.store.release(own, lease)

        # The database failing over is why the handler's work was lost, often: retry a while
        # (a third of the lease), else the key answers 409 to every retry until the lease ends.
        await retry_while_unreachable(
            release,
            for_s=self._middleware.store.lease_ms / 3000,
            what="the release of an idempotency claim",
            log=log,
        )

    async def _close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
