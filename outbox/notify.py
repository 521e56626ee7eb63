"""PostgreSQL LISTEN on a dedicated asyncpg connection, shared by the relay and agent actions.

Notifications are delivered at commit, so a listener learns of a change as soon as it is
visible. A listener is an optimisation: whoever uses one polls as well, since a notification can
be lost with the connection (or never sent, on SQLite).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from outboxkit.outbox.db import TLS_PARAMETERS, asyncpg_connect_args, pg_tls
from outboxkit.outbox.extras import POSTGRES, require
from outboxkit.outbox.hosts import connect_in_turn, libpq_uri, pg_address
from outboxkit.outbox.pooler import PARAMETERS as POOLER_PARAMETERS
from outboxkit.outbox.pooler import listen_url
from sqlalchemy.engine import URL

log = logging.getLogger(__name__)
_said_polling = False


class ListenRefusedError(ConnectionError):
    """The server refused the LISTEN connection (asyncpg's error, kept as ``__cause__``)."""


LISTEN_ERRORS: tuple[type[BaseException], ...] = (OSError, TimeoutError)
"""What connecting and listening may raise when the server cannot be reached or refuses
(a refusal is a :class:`ListenRefusedError`, so asyncpg is imported only where it is used)."""


@asynccontextmanager
async def listening(
    db_url: str | URL,
    channel: str,
    on_notify: Callable[[str], None],
    *,
    connect_timeout_s: float = 10.0,
) -> AsyncIterator[asyncio.Event]:
    """LISTEN on ``channel``; call ``on_notify(payload)`` for every notification meanwhile.

    Yields an event that is set if the connection is lost (no more notifications then). Raises
    one of :data:`LISTEN_ERRORS` if the connection cannot be made. The URL's hosts are tried in
    turn, each bounded by its ``connect_timeout`` (else ``connect_timeout_s``), keeping the
    first that matches its ``target_session_attrs``. Behind a transaction pooler
    (``pooler=transaction``) the connection goes to the URL's ``listen_host``; without one
    nothing is heard (the caller polls, as it does anyway) and a line says so, once a process.
    """
    asyncpg = require("asyncpg", POSTGRES, "LISTEN/NOTIFY")
    target = listen_url(db_url)
    if target is None:
        _say_polling()
        yield asyncio.Event()  # never set: nothing to lose
        return
    address = pg_address(target)
    try:
        connection = await connect_in_turn(
            dsn=listen_dsn(target),
            host=[host.name for host in address.hosts] or None,
            port=[host.port_or_default() for host in address.hosts] or None,
            target_session_attrs=address.target_session_attrs,
            timeout=address.timeout_or(connect_timeout_s),
            **asyncpg_connect_args(db_url),
        )
    except (asyncpg.PostgresError, asyncpg.TargetServerAttributeNotMatched) as error:
        # no host matched target_session_attrs: mid-switchover, none is the primary yet
        raise ListenRefusedError(str(error)) from error
    try:
        lost = asyncio.Event()
        connection.add_termination_listener(lambda _connection: lost.set())

        def deliver(_connection: Any, _pid: int, _channel: str, payload: str) -> None:
            on_notify(payload)

        try:
            await connection.add_listener(channel, deliver)
        except asyncpg.PostgresError as error:
            raise ListenRefusedError(str(error)) from error
        yield lost
    finally:
        await asyncio.shield(_close(connection))


def listen_dsn(db_url: str | URL) -> str:
    """A libpq-style DSN (for asyncpg and psycopg2) from a SQLAlchemy URL of any PostgreSQL
    driver and any multi-host spelling (:mod:`outboxkit.outbox.hosts`): the hosts as
    ``h1:p1,h2:p2``, ``target_session_attrs`` kept, ``connect_timeout`` left to the caller.

    TLS is spelled as :func:`outboxkit.outbox.db.pg_tls` reads it (``ssl=`` becomes
    ``sslmode``, loopback gets ``disable``); :func:`listening` also passes asyncpg the engines'
    ``ssl=`` (:func:`~outboxkit.outbox.db.asyncpg_connect_args`), which wins.
    """
    address = pg_address(db_url)
    unsent = (*TLS_PARAMETERS, *POOLER_PARAMETERS)  # TLS as below; the pooler's are outboxkit's
    address = replace(address, url=address.url.difference_update_query(unsent))
    return libpq_uri(address, pg_tls(db_url).libpq_query())


def _say_polling() -> None:
    global _said_polling
    if not _said_polling:
        _said_polling = True
        log.warning(
            "LISTEN skipped: the database URL goes through a transaction pooler"
            " (pooler=transaction) and names no listen_host=HOST:PORT of the server itself;"
            " polling instead"
        )


async def _close(connection: Any) -> None:
    import asyncpg

    try:
        await asyncio.wait_for(connection.close(), 5)
    except (*LISTEN_ERRORS, asyncpg.PostgresError):
        connection.terminate()
