"""The service the HTTP idempotency benchmark calls, as a uvicorn target
(``bench.http_app:app``; the database comes from ``OUTBOXKIT_DB_URL``).

One endpoint, served twice by one process: ``POST /plain/orders`` straight to the handler, and
``POST /idem/orders`` through :class:`~outboxkit.idempotency.IdempotencyMiddleware`. Both insert
one order row and one outbox event in one transaction and answer 201 with the order's id; the
idempotent side uses the request's session, so its transaction also completes the key.
"""

from __future__ import annotations

import os
from typing import Any

from outboxkit.idempotency import IdempotencyMiddleware, header_scope, idempotency_session
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

orders_metadata = MetaData()
orders = Table(
    "bench_http_orders",
    orders_metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("customer", String(64), nullable=False),
    Column("amount_cents", Integer, nullable=False),
)
outbox = Outbox(default_topic="bench.orders")


async def place(session: AsyncSession, body: dict[str, Any]) -> JSONResponse:
    """The work of both sides: one row and its event."""
    order_id = (
        await session.execute(
            orders.insert()
            .values(customer=body["customer"], amount_cents=body["amount_cents"])
            .returning(orders.c.id)
        )
    ).scalar_one()
    data = {"id": order_id, "customer": body["customer"]}
    await outbox.add_async(
        session, new_event("bench.order.placed", "/bench", data, partitionkey=str(order_id))
    )
    return JSONResponse({"id": order_id, "status": "placed"}, status_code=201)


def make_app(db_url: str) -> Any:
    """Both sides behind one dispatcher, so the plain side never passes the middleware."""
    engine = make_async_engine(db_url, pool_size=20, max_overflow=0)
    sessions = async_sessionmaker(engine, expire_on_commit=False)

    async def plain_order(request: Request) -> JSONResponse:
        body = await request.json()
        async with sessions() as session, session.begin():
            return await place(session, body)

    async def idem_order(request: Request) -> JSONResponse:
        return await place(await idempotency_session(request.scope), await request.json())

    plain = Starlette(routes=[Route("/plain/orders", plain_order, methods=["POST"])])
    idem = IdempotencyMiddleware(
        Starlette(routes=[Route("/idem/orders", idem_order, methods=["POST"])]),
        sessions=sessions,
        routes=["POST /idem/orders"],
        scope_of=header_scope("X-Tenant"),
    )

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/idem/"):
            await idem(scope, receive, send)
        else:
            await plain(scope, receive, send)

    return app


app = make_app(os.environ["OUTBOXKIT_DB_URL"]) if "OUTBOXKIT_DB_URL" in os.environ else None
