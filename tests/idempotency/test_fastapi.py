"""The FastAPI dependency form: a route opts in by declaring the idempotent session."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from outboxkit.idempotency import IdempotencyMiddleware, header_scope
from outboxkit.idempotency.depends import Idempotent, IdempotentSession
from outboxkit.outbox.db import make_async_engine
from pydantic import BaseModel

from tests.idempotency.test_http import headers
from tests.support.http import serving
from tests.support.idempotent_app import count_payments, create_tables, payments
from tests.support.waits import scaled


class PaymentIn(BaseModel):
    amount_cents: int


@asynccontextmanager
async def fastapi_service(db_url: str, added: bool) -> AsyncIterator[httpx.AsyncClient]:
    create_tables(db_url)
    engine = make_async_engine(db_url)
    api = FastAPI()

    @api.post("/payments", status_code=201)
    async def create(payment: PaymentIn, session: IdempotentSession) -> dict[str, object]:
        inserted = await session.execute(
            payments.insert()
            .values(tenant="acme", amount_cents=payment.amount_cents, kind="payment")
            .returning(payments.c.id)
        )
        return {"id": inserted.scalar_one(), "receipt": uuid.uuid4().hex}

    @api.post("/quotes")
    async def quote(payment: PaymentIn, idempotency: Idempotent) -> dict[str, object]:
        return {"quote": uuid.uuid4().hex, "key": idempotency.key}

    @api.post("/echo")
    async def echo(payment: PaymentIn) -> dict[str, int]:
        return {"amount_cents": payment.amount_cents}

    app: Any = api
    if added:  # inside FastAPI's own error middleware
        api.add_middleware(IdempotencyMiddleware, engine=engine, scope_of=header_scope("X-Tenant"))
    else:  # around the whole app
        app = IdempotencyMiddleware(api, engine=engine, scope_of=header_scope("X-Tenant"))
    try:
        async with (
            serving(app) as base_url,
            httpx.AsyncClient(base_url=base_url, timeout=scaled(60)) as client,
        ):
            yield client
    finally:
        await engine.dispose()


@pytest.mark.parametrize("added", [True, False], ids=["add_middleware", "wrapped"])
async def test_routes_opt_in_through_the_dependency(sqlite_url: str, added: bool) -> None:
    body = {"amount_cents": 300}
    async with fastapi_service(sqlite_url, added) as client:
        first = await client.post("/payments", json=body, headers=headers("k1"))
        again = await client.post("/payments", json=body, headers=headers("k1"))
        assert first.status_code == again.status_code == 201
        assert again.content == first.content and again.headers["idempotent-replay"] == "true"
        other = await client.post("/payments", json={"amount_cents": 1}, headers=headers("k1"))
        assert (other.status_code, other.json()["differs"]) == (422, ["body"])
        assert (await client.post("/payments", json=body, headers=headers(None))).status_code == 400

        quote = await client.post("/quotes", json=body, headers=headers("q1"))
        assert quote.json()["key"] == "q1"
        assert (await client.post("/quotes", json=body, headers=headers("q1"))).content == (
            quote.content
        )
        # a route without the dependency needs no key and is never replayed
        echoes = [await client.post("/echo", json=body, headers=headers("k1")) for _ in range(2)]
        assert [e.status_code for e in echoes] == [200, 200]
        assert all("idempotent-replay" not in e.headers for e in echoes)
        invalid = await client.post("/payments", json={"amount_cents": "x"}, headers=headers("k2"))
        assert invalid.status_code == 422 and "differs" not in invalid.json()  # FastAPI's own
    assert count_payments(sqlite_url) == 1


@pytest.mark.parametrize("added", [True, False], ids=["add_middleware", "wrapped"])
async def test_a_chunked_body_over_the_limit_on_an_opted_in_route_is_413(
    sqlite_url: str, added: bool
) -> None:
    # FastAPI reads the body itself (and would answer 400 for any error reading it): the
    # middleware's limit still answers 413, and neither the handler nor the claim happens.
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"amount_cents": 1' + b" " * 600_000
        yield b" " * 600_000 + b"}"

    async with fastapi_service(sqlite_url, added) as client:
        refused = await client.post("/payments", content=chunks(), headers=headers("big"))
        assert refused.status_code == 413, refused.text
        assert refused.json()["title"] == "Content too large"
        fits = await client.post("/payments", json={"amount_cents": 1}, headers=headers("big"))
        assert fits.status_code == 201 and "idempotent-replay" not in fits.headers
    assert count_payments(sqlite_url) == 1
