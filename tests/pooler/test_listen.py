"""LISTEN behind a transaction pooler: it needs a session, so it goes to the server named by
the URL's ``listen_host``; without one the listener hears nothing, says so once, and its user
polls."""

from __future__ import annotations

import asyncio
import logging

import pytest
from outboxkit.outbox import notify
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.notify import listening
from outboxkit.testing.postgres import server_url
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.support.waits import scaled


async def notify_through(url: str, channel: str, payload: str) -> None:
    engine = make_async_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.execute(
                text("SELECT pg_notify(:channel, :payload)"),
                {"channel": channel, "payload": payload},
            )
    finally:
        await engine.dispose()


async def test_listen_goes_to_the_listen_host_and_hears_commits_made_through_the_pooler(
    pgbouncer_url: str,
) -> None:
    server = make_url(server_url())
    url = f"{pgbouncer_url}?pooler=transaction&listen_host={server.host}:{server.port}"
    heard: asyncio.Queue[str] = asyncio.Queue()
    async with listening(url, "pooled", heard.put_nowait) as lost:
        await notify_through(url, "pooled", "p-1")
        assert await asyncio.wait_for(heard.get(), scaled(10)) == "p-1"
        assert not lost.is_set()


async def test_without_a_listen_host_the_listener_says_once_that_it_polls(
    pgbouncer_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notify, "_said_polling", False)
    caplog.set_level(logging.INFO)
    url = f"{pgbouncer_url}?pooler=transaction"
    for _ in range(3):
        async with listening(url, "pooled", lambda _payload: None) as lost:
            assert not lost.is_set()
    said = [r for r in caplog.records if "LISTEN" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"]
    assert "pooler=transaction" in said[0].getMessage()
    assert "listen_host" in said[0].getMessage()
