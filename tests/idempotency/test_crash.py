"""The server process killed in the middle of a handler: nothing committed, and the retry after
the claim's lease executes exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from outboxkit.outbox.tables import outbox_events
from outboxkit.testing.processes import kill, terminate

from tests.idempotency.test_http import BODY, count, headers
from tests.support.http import listening_socket, start_server, url_of, wait_until_serving
from tests.support.idempotent_app import count_payments, create_tables
from tests.support.kafka import wait_for
from tests.support.waits import scaled

LEASE_S = 2.0


async def test_a_server_killed_mid_handler_leaves_no_effect_and_the_retry_runs_once(
    db_url: str, tmp_path: Path
) -> None:
    create_tables(db_url)
    hold, reached = tmp_path / "hold", tmp_path / "reached"
    env = {
        "OUTBOXKIT_DB_URL": db_url,
        "IDEM_LEASE_S": str(LEASE_S),
        "IDEM_HOLD_FILE": str(hold),
        "IDEM_REACHED_FILE": str(reached),
    }
    app = "tests.support.idempotent_server:app"
    with listening_socket() as sock:
        base_url = url_of(sock)
        server = start_server(app, sock, env, tmp_path / "server.log")
        try:
            await wait_until_serving(base_url, server)
            hold.touch()
            async with httpx.AsyncClient(base_url=base_url, timeout=scaled(60)) as client:
                doomed = asyncio.create_task(
                    client.post("/payments", json=BODY, headers=headers("k-crash"))
                )
                await wait_for(reached.exists, bool, 30, "the handler to write its effect")
                kill(server)  # SIGKILL: the handler's transaction never commits
                try:
                    await doomed
                    raise AssertionError("the killed server answered")
                except httpx.TransportError:
                    pass
        finally:
            terminate(server)

        hold.unlink()
        assert count_payments(db_url) == 0 and count(db_url, outbox_events) == 0
        server = start_server(app, sock, env, tmp_path / "server.log")
        try:
            await wait_until_serving(base_url, server)
            async with httpx.AsyncClient(base_url=base_url, timeout=scaled(60)) as client:

                async def retry() -> httpx.Response:
                    return await client.post("/payments", json=BODY, headers=headers("k-crash"))

                # the dead request's claim holds the key until its lease ends: 409 until then
                retried = await wait_for(retry, lambda r: r.status_code != 409, 30, "the lease")
                assert retried.status_code == 201 and "idempotent-replay" not in retried.headers
                replay = await retry()
                assert replay.content == retried.content
        finally:
            terminate(server)
    assert count_payments(db_url) == 1 and count(db_url, outbox_events) == 1
