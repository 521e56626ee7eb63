"""Writing what only this process knows, through a database that is failing over.

A worker that holds an outcome (an action that returned, a claim to release) and cannot reach
the database at that moment (a primary crashing or switching over, a proxy moving to the new
one) would otherwise leave its record claimed until a lease ends. :func:`retry_while_unreachable`
retries such a write with growing backoff for a bounded time; the writes it is used for are
idempotent, so one whose reply was lost is safe to send again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.secrecy import describe_error, sqlstate
from sqlalchemy.exc import DBAPIError, OperationalError

T = TypeVar("T")

# The server is going down or coming up (admin shutdown, crash shutdown, starting), or took the
# write as a standby (the proxy still pointed at the old primary): all mended by waiting.
UNREACHABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "25006"})
RETRY_BACKOFF = Backoff(base_s=0.1, cap_s=2.0)


def database_unreachable(error: BaseException) -> bool:
    """Whether ``error`` says the database cannot take the write now (a lost connection, a
    server shutting down or starting, a standby), as opposed to a mistake."""
    if isinstance(error, OSError | TimeoutError):
        return True
    if not isinstance(error, DBAPIError):
        return False
    code = sqlstate(error) or ""
    return (
        error.connection_invalidated
        or isinstance(error, OperationalError)
        or code.startswith("08")
        or code in UNREACHABLE_SQLSTATES
    )


async def retry_while_unreachable(
    write: Callable[[], Awaitable[T]], *, for_s: float, what: str, log: logging.Logger
) -> T:
    """``await write()``, retried while the database is unreachable (:func:`database_unreachable`)
    for up to ``for_s`` seconds, then the last error is raised; one WARNING on ``log`` when it
    starts failing and one INFO when it gets through."""
    deadline = time.monotonic() + for_s
    attempt = 0
    while True:
        try:
            result = await write()
        except Exception as error:
            attempt += 1
            delay = RETRY_BACKOFF.delay(attempt)
            if not database_unreachable(error) or time.monotonic() + delay > deadline:
                raise
            if attempt == 1:
                log.warning(
                    "database unreachable while writing %s: %s; retrying",
                    what,
                    describe_error(error),
                )
            await asyncio.sleep(delay)
            continue
        if attempt:
            log.info("wrote %s after %d failed attempts", what, attempt)
        return result
