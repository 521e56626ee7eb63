"""A small Starlette service whose POST routes honour ``Idempotency-Key``, for the tests.

``POST /payments`` is transactional: it writes a payment row and an outbox event with the
request's session, so both commit with the stored response. ``POST /notes`` is not: it
commits its row in a session of its own. ``POST /uploads`` stores the size of its raw body
with the request's session. ``POST /free`` requires no key. The handler can be paused, made to
answer an error status, or made to raise, through :class:`Controls`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outboxkit.idempotency import IdempotencyMiddleware, Outcome, header_scope, idempotency_session
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from sqlalchemy import Column, Integer, MetaData, String, Table, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

effects = MetaData()
payments = Table(
    "idem_payments",
    effects,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant", String(64), nullable=False),
    Column("amount_cents", Integer, nullable=False),
    Column("kind", String(16), nullable=False),
)
ROUTES = ["POST /payments", "POST /notes", "POST /uploads"]


@dataclass
class Controls:
    """What the test makes the next handler do."""

    gate: asyncio.Event | None = None
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    statuses: list[int] = field(default_factory=list)  # answer these (after writing), in turn
    raises: int = 0  # raise this many times (after writing)
    hold_file: Path | None = None  # in a server process: wait while this file exists
    reached_file: Path | None = None
    calls: int = 0

    async def pause(self) -> None:
        """Say the handler got here, then wait for the gate or the hold file."""
        self.calls += 1
        self.reached.set()
        if self.reached_file is not None:
            self.reached_file.touch()
        if self.gate is not None:
            await self.gate.wait()
        while self.hold_file is not None and self.hold_file.exists():
            await asyncio.sleep(0.05)

    def failure(self) -> int | None:
        """The status to answer instead of 201, or raise; ``None`` to succeed."""
        if self.raises:
            self.raises -= 1
            raise RuntimeError("the handler failed")
        return self.statuses.pop(0) if self.statuses else None


def create_tables(db_url: str) -> None:
    """Create the service's own table (outboxkit's come from the migrations)."""
    engine = make_engine(db_url)
    effects.create_all(engine)
    engine.dispose()


def count_payments(db_url: str, kind: str | None = None) -> int:
    """Rows in the effect table (of one kind)."""
    engine = make_engine(db_url)
    query = select(func.count()).select_from(payments)
    if kind is not None:
        query = query.where(payments.c.kind == kind)
    with engine.connect() as conn:
        count = int(conn.scalar(query) or 0)
    engine.dispose()
    return count


def build_app(
    engine: AsyncEngine,
    *,
    topic: str = "test.payments",
    controls: Controls | None = None,
    outcomes: list[Outcome] | None = None,
    **options: Any,
) -> IdempotencyMiddleware:
    """The service wrapped in the middleware; ``options`` go to the middleware."""
    outbox = Outbox(default_topic=topic)
    controls = controls or Controls()
    sessions = async_sessionmaker(engine, expire_on_commit=False)

    async def create_payment(request: Request) -> JSONResponse:
        session = await idempotency_session(request.scope)
        body = await request.json()
        tenant = request.headers["x-tenant"]
        payment_id = (
            await session.execute(
                payments.insert()
                .values(tenant=tenant, amount_cents=body["amount_cents"], kind="payment")
                .returning(payments.c.id)
            )
        ).scalar_one()
        event = new_event(
            "test.payment.created",
            "/tests/payments",
            {"id": payment_id, "tenant": tenant},
            partitionkey=str(payment_id),
        )
        await outbox.add_async(session, event)
        await controls.pause()
        status = controls.failure()
        if status is not None:
            return JSONResponse({"error": "failed on purpose"}, status_code=status)
        # a receipt no second run could reproduce: a replay must be the stored bytes
        receipt = {"id": payment_id, "tenant": tenant, "receipt": uuid.uuid4().hex}
        return JSONResponse(receipt, status_code=201)

    async def create_note(request: Request) -> JSONResponse:
        body = await request.json()
        async with sessions() as session, session.begin():
            note_id = (
                await session.execute(
                    payments.insert()
                    .values(
                        tenant=request.headers["x-tenant"],
                        amount_cents=body["amount_cents"],
                        kind="note",
                    )
                    .returning(payments.c.id)
                )
            ).scalar_one()
        status = controls.failure()
        if status is not None:
            return JSONResponse({"error": "failed on purpose"}, status_code=status)
        return JSONResponse({"id": note_id, "receipt": uuid.uuid4().hex}, status_code=201)

    async def upload(request: Request) -> JSONResponse:
        session = await idempotency_session(request.scope)
        size = len(await request.body())  # the effect records how much of the body it got
        await session.execute(
            payments.insert().values(
                tenant=request.headers["x-tenant"], amount_cents=size, kind="upload"
            )
        )
        return JSONResponse({"bytes": size}, status_code=201)

    async def free(request: Request) -> PlainTextResponse:
        return PlainTextResponse("free", status_code=200)

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route("/payments", create_payment, methods=["POST"]),
            Route("/notes", create_note, methods=["POST"]),
            Route("/uploads", upload, methods=["POST"]),
            Route("/free", free, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )
    record: Callable[[Outcome], None] | None = outcomes.append if outcomes is not None else None
    options.setdefault("routes", ROUTES)
    return IdempotencyMiddleware(
        app, engine=engine, scope_of=header_scope("X-Tenant"), on_outcome=record, **options
    )
