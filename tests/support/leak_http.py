"""The HTTP app of the leak hunt (``tests.support.leak_http:app``, served by uvicorn).

``POST /orders`` behind :class:`~outboxkit.idempotency.IdempotencyMiddleware`: it writes the
body's note into an outbox event with the request's session and answers with it (the stored
response holds it). ``GET /metrics`` serves the process's Prometheus registry. The database
comes from the config file (``OUTBOXKIT_CONFIG``), like every outboxkit process's.
"""

from __future__ import annotations

import os

from outboxkit.idempotency import IdempotencyMiddleware, header_scope, idempotency_session
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.settings import Settings
from prometheus_client import generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

outbox = Outbox(default_topic=os.environ.get("LEAK_TOPIC", "leak-events"))


async def create_order(request: Request) -> JSONResponse:
    session = await idempotency_session(request.scope)
    body = await request.json()
    event = new_event("leak.http.order", "leak-http", {"note": body["note"]})
    await outbox.add_async(session, event)
    return JSONResponse({"accepted": body["note"]}, status_code=201)


async def health(request: Request) -> Response:
    return PlainTextResponse("ok")


async def metrics(request: Request) -> Response:
    return Response(generate_latest(), media_type="text/plain")


app = IdempotencyMiddleware(
    Starlette(
        routes=[
            Route("/orders", create_order, methods=["POST"]),
            Route("/health", health),
            Route("/metrics", metrics),
        ]
    ),
    engine=make_async_engine(Settings().db_url),
    scope_of=header_scope("X-Tenant"),
    routes=["POST /orders"],
)
