"""TLS to PostgreSQL, spelled the libpq way, for both drivers, LISTEN and every command.

Against a cluster of the session's own that accepts TLS only (``hostssl``) with a server
certificate from a CA the test made (``tls_pg``): ``require`` and ``verify-full`` with the
right CA connect over TLS; ``verify-full`` with another CA and ``disable`` are refused, and a
command says so in one line with exit code 2.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
import pytest
from outboxkit.outbox.db import asyncpg_connect_args, make_async_engine, make_engine
from outboxkit.outbox.notify import listen_dsn
from outboxkit.testing.postgres import TlsCluster
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tests.support.ops import CliResult, cli, cli_process
from tests.support.waits import scaled

CASES: dict[str, Callable[[TlsCluster], str]] = {
    "require": lambda c: f"{c.url}?sslmode=require",
    "verify-full": lambda c: f"{c.url}?sslmode=verify-full&sslrootcert={c.ca_file}",
    "asyncpg-spelling": lambda c: f"{c.url}?ssl=verify-full&sslrootcert={c.ca_file}",
}
REFUSED: dict[str, tuple[Callable[[TlsCluster], str], str]] = {
    "wrong-ca": (
        lambda c: f"{c.url}?sslmode=verify-full&sslrootcert={c.wrong_ca_file}",
        "certificate verify failed",
    ),
    "disable": (lambda c: f"{c.url}?sslmode=disable", "no encryption"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_drivers_and_listen_connect_over_tls(tls_pg: TlsCluster, case: str) -> None:
    url = CASES[case](tls_pg)
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            assert connection.scalar(text("SHOW ssl")) == "on"
            assert connection.scalar(text(OWN_TLS))
    finally:
        engine.dispose()

    async def over_asyncpg() -> tuple[bool, bool]:
        async_engine = make_async_engine(url)
        try:
            async with async_engine.connect() as connection:
                engine_tls = await connection.scalar(text(OWN_TLS))
        finally:
            await async_engine.dispose()
        # the relay's LISTEN connection, from the engine's URL as the relay builds it
        listen = await asyncpg.connect(
            listen_dsn(async_engine.url),
            timeout=scaled(10),
            **asyncpg_connect_args(async_engine.url),
        )
        try:
            listen_tls = await listen.fetchval(OWN_TLS)
        finally:
            await listen.close()
        return bool(engine_tls), bool(listen_tls)

    assert asyncio.run(over_asyncpg()) == (True, True)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_both_drivers_and_listen_are_refused(tls_pg: TlsCluster, case: str) -> None:
    make, reason = REFUSED[case]
    url = make(tls_pg)
    engine = make_engine(url)
    with pytest.raises(DBAPIError, match=reason):
        engine.connect().close()
    engine.dispose()

    async def over_asyncpg() -> None:
        async_engine = make_async_engine(url)
        try:
            with pytest.raises((DBAPIError, OSError)) as refused:
                await (await async_engine.connect()).close()
            assert reason in str(refused.value)
        finally:
            await async_engine.dispose()
        with pytest.raises((asyncpg.PostgresError, OSError)) as refused:
            await asyncpg.connect(listen_dsn(url), timeout=scaled(10), **asyncpg_connect_args(url))
        assert reason in str(refused.value)

    asyncio.run(over_asyncpg())


OWN_TLS = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
COMMANDS = {
    "migrate": ["migrate"],
    "status": ["status", "--json"],
    "outbox list": ["outbox", "list"],
    "actions list": ["actions", "list"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
async def test_every_command_works_over_tls_and_refusals_are_one_line(
    tls_pg: TlsCluster, kafka_bootstrap: str, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOXKIT_KAFKA_BOOTSTRAP", kafka_bootstrap)  # status reads the broker
    argv = COMMANDS[command]
    for case in ("require", "verify-full"):
        done = await cli(*argv, "--db-url", CASES[case](tls_pg))
        assert done.code in (0, 1), (case, done.err)  # status: 1 if a threshold is crossed
        if command == "status":
            assert done.json()["sources"]["database"]["status"] == "ok"
    for make, reason in REFUSED.values():
        done = await cli(*argv, "--db-url", make(tls_pg))
        _assert_refused(done, reason, command)


def test_relay_drain_over_tls_and_refused_in_one_line(
    tls_pg: TlsCluster, kafka_bootstrap: str
) -> None:
    for case in ("require", "verify-full"):
        done = cli_process(
            "relay", "--drain", "--db-url", CASES[case](tls_pg), "--bootstrap", kafka_bootstrap
        )
        assert done.code == 0, (case, done.err)
    for make, reason in REFUSED.values():
        done = cli_process(
            "relay", "--drain", "--db-url", make(tls_pg), "--bootstrap", kafka_bootstrap
        )
        _assert_refused(done, reason, "relay")


def _assert_refused(done: CliResult, reason: str, command: str) -> None:
    if command == "status":
        # status reports an unreachable source in its report, with its own exit code 3
        assert done.code == 3, done.err
        assert reason in done.out
        return
    assert done.code == 2, done.err
    assert reason in done.error_line()
