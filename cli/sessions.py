"""Running one piece of database work for a command: a fresh engine, one session, disposed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from outboxkit.cli.options import settings_from
from outboxkit.outbox.db import make_async_engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

T = TypeVar("T")


def in_session(db_url: str | None, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """Run ``await work(session)`` on the configured database and return its result.

    The session is not in a transaction of its own: ``work`` begins one if it writes.
    """
    settings = settings_from(db_url)

    async def main() -> T:
        engine = make_async_engine(settings.db_url)
        try:
            async with async_sessionmaker(engine, expire_on_commit=False)() as session:
                return await work(session)
        finally:
            await engine.dispose()

    return asyncio.run(main())
