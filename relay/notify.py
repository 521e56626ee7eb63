"""Waking the relay at once on commit: PostgreSQL LISTEN on the channel the outbox trigger uses."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.db import TLS_PARAMETERS, asyncpg_connect_args, pg_tls
from sqlalchemy.engine import URL, make_url

CHANNEL = "outboxkit_outbox"
log = logging.getLogger("outboxkit.relay")


class CommitListener:
    """Keeps one asyncpg connection listening; sets ``wake`` on every notification.

    If the connection drops it reconnects with backoff; meanwhile the relay falls back to polling.
    """

    def __init__(self, db_url: str | URL, wake: asyncio.Event) -> None:
        self._dsn = listen_dsn(db_url)
        self._tls = asyncpg_connect_args(db_url)  # the engines' TLS, for asyncpg
        self._wake = wake
        self._task: asyncio.Task[None] | None = None
        self._backoff = Backoff(base_s=0.5, cap_s=15.0, floor_s=0.1)

    def start(self) -> None:
        """Start listening in the background."""
        self._task = asyncio.create_task(self._run(), name="outboxkit-listen")

    async def stop(self) -> None:
        """Stop listening and close the connection."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        attempt = 0
        while True:
            lost = asyncio.Event()
            try:
                connection = await asyncpg.connect(self._dsn, timeout=10, **self._tls)
            except (OSError, asyncpg.PostgresError, TimeoutError) as error:
                attempt += 1
                if attempt == 1:
                    log.warning("LISTEN unavailable, polling meanwhile: %s", error)
                await asyncio.sleep(self._backoff.delay(attempt))
                continue
            try:
                connection.add_termination_listener(lambda _c, lost=lost: lost.set())
                await connection.add_listener(CHANNEL, lambda *_: self._wake.set())
                if attempt:
                    log.info("LISTEN restored")
                attempt = 0
                self._wake.set()  # catch up on anything committed while we were away
                await lost.wait()
                log.warning("LISTEN connection lost, polling meanwhile")
            finally:
                await asyncio.shield(_close(connection))


def listen_dsn(db_url: str | URL) -> str:
    """A libpq-style DSN for asyncpg from a SQLAlchemy URL of any PostgreSQL driver.

    TLS is spelled as :func:`outboxkit.outbox.db.pg_tls` reads it (``ssl=`` becomes
    ``sslmode``, loopback gets ``disable``); :class:`CommitListener` also passes asyncpg the
    engines' ``ssl=`` (:func:`~outboxkit.outbox.db.asyncpg_connect_args`), which wins.
    """
    url = make_url(db_url).set(drivername="postgresql")
    query = pg_tls(url).libpq_query()
    url = url.difference_update_query(TLS_PARAMETERS).update_query_dict(query)
    return url.render_as_string(hide_password=False)


async def _close(connection: asyncpg.Connection) -> None:
    try:
        await asyncio.wait_for(connection.close(), 5)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        connection.terminate()
