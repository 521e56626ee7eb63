"""Waiting in the relay's loops: outage errors, sleeping until stopped, waking on a commit."""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

# What the relay treats as a database outage (retried with backoff).
DATABASE_ERRORS = (DBAPIError, PoolTimeoutError, OSError)


async def sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def wait_any(stop: asyncio.Event, wake: asyncio.Event, timeout: float) -> None:
    """Wait until ``stop`` or ``wake`` is set, at most ``timeout`` seconds."""
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
