"""Hostile bodies on a real uvicorn server, probed with raw sockets: truncated, chunked and cut,
too large, too slow. Effects and keys are counted in the database (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
from outboxkit.idempotency import Outcome
from outboxkit.idempotency.tables import http_idempotency_keys
from outboxkit.outbox.db import make_async_engine, make_engine
from sqlalchemy import select

from tests.idempotency.test_http import count
from tests.support.http import serving
from tests.support.idempotent_app import build_app, count_payments, create_tables, payments
from tests.support.kafka import wait_for

HEAD = "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Tenant: acme\r\nIdempotency-Key: {key}\r\n"


@asynccontextmanager
async def server(db_url: str, **options: Any) -> AsyncIterator[tuple[str, list[Outcome]]]:
    """The test service on uvicorn: its base URL and the outcomes the middleware counted."""
    create_tables(db_url)
    engine = make_async_engine(db_url)
    outcomes: list[Outcome] = []
    try:
        async with serving(build_app(engine, outcomes=outcomes, **options)) as base_url:
            yield base_url, outcomes
    finally:
        await engine.dispose()


async def connect(base_url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    where = urlsplit(base_url)
    assert where.hostname == "127.0.0.1"  # loopback only
    return await asyncio.open_connection(where.hostname, where.port)


def upload_sizes(db_url: str) -> list[int]:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        query = select(payments.c.amount_cents).where(payments.c.kind == "upload")
        sizes = [int(n) for n in conn.scalars(query)]
    engine.dispose()
    return sizes


async def saw(outcomes: list[Outcome], outcome: Outcome) -> None:
    await wait_for(lambda: outcome in outcomes, bool, 60, f"the middleware to count {outcome}")


async def retry_whole(base_url: str, key: str, body: bytes) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        return await client.post(
            "/uploads", content=body, headers={"X-Tenant": "acme", "Idempotency-Key": key}
        )


async def test_a_disconnect_before_the_declared_length_runs_nothing(db_url: str) -> None:
    # Before: the handler committed the 40,000 bytes it had, and the retry got 422 (body).
    async with server(db_url) as (base_url, outcomes):
        _reader, writer = await connect(base_url)
        writer.write(
            (HEAD.format(path="/uploads", key="up-1") + "Content-Length: 100000\r\n\r\n").encode()
        )
        writer.write(b"x" * 40_000)
        await writer.drain()
        writer.close()
        await saw(outcomes, Outcome.BODY_INCOMPLETE)
        assert count(db_url, http_idempotency_keys) == 0 and upload_sizes(db_url) == []
        retry = await retry_whole(base_url, "up-1", b"x" * 100_000)
        assert (retry.status_code, retry.json()) == (201, {"bytes": 100_000})
    assert upload_sizes(db_url) == [100_000]


async def test_a_chunked_body_cut_before_its_last_chunk_runs_nothing(db_url: str) -> None:
    async with server(db_url) as (base_url, outcomes):
        _reader, writer = await connect(base_url)
        head = HEAD.format(path="/uploads", key="up-2") + "Transfer-Encoding: chunked\r\n\r\n"
        writer.write(head.encode() + b"2710\r\n" + b"y" * 10_000 + b"\r\n")
        await writer.drain()
        writer.close()
        await saw(outcomes, Outcome.BODY_INCOMPLETE)
        assert count(db_url, http_idempotency_keys) == 0 and upload_sizes(db_url) == []
        retry = await retry_whole(base_url, "up-2", b"y" * 20_000)
        assert (retry.status_code, retry.json()) == (201, {"bytes": 20_000})
    assert upload_sizes(db_url) == [20_000]


async def test_a_declared_body_over_the_limit_is_413_before_it_is_sent(db_url: str) -> None:
    # Before: the 50 MB body was buffered whole (+100 MB RSS); now not one byte of it is read.
    async with server(db_url) as (base_url, outcomes):
        for path in ("/uploads", "/free"):  # a key route, and one that passes straight through
            reader, writer = await connect(base_url)
            writer.write(
                (HEAD.format(path=path, key="big") + "Content-Length: 50000000\r\n\r\n").encode()
            )
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), 60)
            assert status.startswith(b"HTTP/1.1 413"), status
            writer.close()
        assert outcomes == [Outcome.BODY_TOO_LARGE, Outcome.BODY_TOO_LARGE]
    assert count(db_url, http_idempotency_keys) == 0 and upload_sizes(db_url) == []


async def test_a_chunked_body_is_refused_as_it_crosses_the_route_limit(db_url: str) -> None:
    limits = {"POST /uploads": 300_000}
    async with server(db_url, max_body_bytes=100_000, body_limits=limits) as (base_url, outcomes):
        reader, writer = await connect(base_url)
        head = HEAD.format(path="/uploads", key="up-3") + "Transfer-Encoding: chunked\r\n\r\n"
        writer.write(head.encode())
        for _ in range(4):  # 400,000 bytes, never the final chunk: refused before the end
            writer.write(b"186a0\r\n" + b"z" * 100_000 + b"\r\n")
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 60)
        assert status.startswith(b"HTTP/1.1 413"), status
        writer.close()
        assert outcomes == [Outcome.BODY_TOO_LARGE]
        fits = await retry_whole(base_url, "up-3", b"z" * 250_000)  # within the route's limit
        assert (fits.status_code, fits.json()) == (201, {"bytes": 250_000})
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
            other = await client.post(
                "/payments",
                content=b"{" + b" " * 150_000 + b"}",
                headers={"X-Tenant": "acme", "Idempotency-Key": "p-1"},
            )
        assert other.status_code == 413  # the global default elsewhere
    assert upload_sizes(db_url) == [250_000] and count_payments(db_url, "payment") == 0


async def test_a_slow_body_is_408_the_connection_closed_and_the_key_unclaimed(
    db_url: str,
) -> None:
    async with server(db_url, body_timeout_s=1.0) as (base_url, outcomes):
        reader, writer = await connect(base_url)
        writer.write(
            (HEAD.format(path="/uploads", key="up-4") + "Content-Length: 1000\r\n\r\n").encode()
        )
        began = asyncio.get_running_loop().time()
        for _ in range(3):  # slowloris: a byte now and then, never the whole body
            writer.write(b"s")
            await writer.drain()
            await asyncio.sleep(0.2)
        answer = await asyncio.wait_for(reader.read(), 60)  # read to EOF: the server closes
        took = asyncio.get_running_loop().time() - began
        assert answer.startswith(b"HTTP/1.1 408"), answer[:40]
        assert b"connection: close" in answer.lower()
        assert 0.9 <= took < 30, took
        writer.close()
        assert outcomes == [Outcome.BODY_TIMEOUT]
        assert count(db_url, http_idempotency_keys) == 0 and upload_sizes(db_url) == []
        retry = await retry_whole(base_url, "up-4", b"s" * 1000)
        assert (retry.status_code, retry.json()) == (201, {"bytes": 1000})
    assert upload_sizes(db_url) == [1000]
