"""A payment provider on loopback HTTP that honours ``Idempotency-Key`` like real ones do.

It is built on :mod:`outboxkit.idempotency`: a Starlette app under uvicorn, its refunds in a
database (a temporary SQLite file by default, or ``db_url=`` PostgreSQL), wrapped in
:class:`~outboxkit.idempotency.IdempotencyMiddleware`. ``POST /refunds`` with
``Idempotency-Key`` and ``X-Account`` headers and a JSON body ``{"charge_id", "amount_cents",
"currency"}``:

- a new key creates one refund (201); the refund row, its ``provider.refund.created`` outbox
  event and the stored response commit in one transaction;
- the same key with the same body replays the stored response with ``Idempotent-Replay: true``;
- the same key with another body: 422; while the first request is still processing: 409;
- keys are scoped per account, as at Stripe, and expire after 24 h (``key_ttl_s``; the
  ``clock`` can be injected), after which the key names a new refund.

``GET /refunds?idempotency_key=K`` lists the account's refunds (filtered by key) and whether a
request with that key is in flight. Faults can be injected from Python
(:meth:`PaymentProvider.inject`): drop the connection before or after committing the refund,
or hold the request at either point until released.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import uvicorn
from outboxkit.idempotency import (
    IdempotencyMiddleware,
    IdempotencyStore,
    Outcome,
    context_of,
)
from outboxkit.idempotency.scopes import RequestInfo
from outboxkit.migrations.runner import upgrade
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine, make_engine
from sqlalchemy import Column, Integer, MetaData, String, Table, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

HOLD_LIMIT_S = 120.0  # a held request gives up by itself, so a forgotten hold cannot hang
KEY_TTL_S = 24 * 3600.0
FAULT_SLOT = "payment_provider.fault"

provider_tables = MetaData()
refunds_table = Table(
    "provider_refunds",
    provider_tables,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("account", String(64), nullable=False),
    Column("charge_id", String(64), nullable=False),
    Column("amount_cents", Integer, nullable=False),
    Column("currency", String(8), nullable=False),
    Column("idempotency_key", String(255), nullable=False),
    Column("status", String(16), nullable=False),
)


class Fault(Enum):
    """A misbehaviour applied to the next new refund request."""

    DROP_BEFORE_COMMIT = "drop-before-commit"
    DROP_AFTER_COMMIT = "drop-after-commit"
    HOLD_BEFORE_COMMIT = "hold-before-commit"
    HOLD_AFTER_COMMIT = "hold-after-commit"


@dataclass
class Hold:
    """A request paused at a fault point: ``reached`` is set when it gets there."""

    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        """Let the request continue."""
        self.released.set()


@dataclass
class _Slot:
    """The fault a request drew, shared by its handler and the fault layer around it."""

    fault: Fault | None = None
    hold: Hold | None = None


class _Drop(Exception):
    """Close the connection without a (complete) reply."""


class PaymentProvider:
    """The provider's state and its HTTP server; use as a context manager."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        db_url: str | None = None,
        clock: Callable[[], float] | None = None,
        key_ttl_s: float = KEY_TTL_S,
        lease_s: float = 30.0,
    ) -> None:
        self._lock = threading.Lock()
        self._faults: deque[tuple[Fault, Hold | None]] = deque()
        self._holds: list[Hold] = []
        self.replays = 0
        self.conflicts = 0
        self.in_flight_rejections = 0
        # the refunds stay readable after close(); the directory goes with the object
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if db_url is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="payment-provider-")
            db_url = f"sqlite:///{Path(self._tmp.name) / 'provider.db'}"
        self.db_url = db_url
        upgrade(db_url)  # outboxkit's tables, the idempotency keys among them
        self._sync_engine = make_engine(db_url)
        provider_tables.create_all(self._sync_engine)
        self._key_options: dict[str, Any] = {"ttl_s": key_ttl_s, "lease_s": lease_s, "clock": clock}
        self._socket = socket.create_server((host, port))
        self._server: uvicorn.Server | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None
        _quiet_drops()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43121``."""
        host, port = self._socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def start(self) -> PaymentProvider:
        """Start serving in a background thread."""
        self._thread.start()
        self._started.wait(60)
        if self._error is not None:
            raise RuntimeError("the payment provider did not start") from self._error
        return self

    def close(self) -> None:
        """Release every hold and stop the server."""
        with self._lock:
            holds = list(self._holds)
        for hold in holds:
            hold.release()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(30)
        self._socket.close()
        self._sync_engine.dispose()  # reconnects if the refunds are read after close

    def __enter__(self) -> PaymentProvider:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    def inject(self, fault: Fault) -> Hold | None:
        """Apply ``fault`` to the next new refund request; a HOLD fault returns its hold."""
        hold = Hold() if fault in (Fault.HOLD_BEFORE_COMMIT, Fault.HOLD_AFTER_COMMIT) else None
        with self._lock:
            self._faults.append((fault, hold))
            if hold is not None:
                self._holds.append(hold)
        return hold

    def refunds(self, account: str | None = None) -> list[dict[str, Any]]:
        """Refunds committed so far (of one account, or all)."""
        query = select(refunds_table).order_by(refunds_table.c.id)
        if account is not None:
            query = query.where(refunds_table.c.account == account)
        with self._sync_engine.connect() as conn:
            return [_refund(row) for row in conn.execute(query)]

    def refund_count(self, account: str | None = None) -> int:
        """How many refunds were committed (of one account, or all)."""
        return len(self.refunds(account))

    # -- the server (on its own thread and event loop) ---------------------------------------

    def _serve(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as error:  # reported by start()
            self._error = error
        finally:
            self._started.set()

    async def _run(self) -> None:
        engine = make_async_engine(self.db_url)
        try:
            config = uvicorn.Config(
                self.app(engine),
                lifespan="off",
                access_log=False,
                log_level="warning",
                timeout_graceful_shutdown=5,
            )
            self._server = uvicorn.Server(config)
            serving = asyncio.create_task(self._server.serve(sockets=[self._socket]))
            while not self._server.started and not serving.done():
                await asyncio.sleep(0.01)
            self._started.set()
            await serving
        finally:
            await engine.dispose()

    def app(self, engine: AsyncEngine) -> Any:
        """The provider's ASGI app: faults around the idempotency middleware around the API."""
        outbox = Outbox(default_topic="provider.refunds")
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        keys = IdempotencyStore(**self._key_options)

        async def create_refund(request: Request) -> JSONResponse:
            body = _valid_body(await request.body())
            if body is None:
                return JSONResponse({"error": "a valid refund body is required"}, status_code=400)
            slot: _Slot = request.scope[FAULT_SLOT]
            slot.fault, slot.hold = self._next_fault()
            if slot.fault is Fault.DROP_BEFORE_COMMIT:
                raise _Drop  # rolled back, the key released: as if it never arrived
            if slot.fault is Fault.HOLD_BEFORE_COMMIT and slot.hold is not None:
                slot.hold.reached.set()
                await asyncio.to_thread(slot.hold.released.wait, HOLD_LIMIT_S)
            context = context_of(request.scope)
            session = await context.session()
            account, key = _account(request.headers.get("x-account")), context.key
            row_id = (
                await session.execute(
                    refunds_table.insert()
                    .values(account=account, idempotency_key=key, status="succeeded", **body)
                    .returning(refunds_table.c.id)
                )
            ).scalar_one()
            refund = {"id": f"re_{row_id:06d}", "account": account, **body}
            refund |= {"idempotency_key": key, "status": "succeeded"}
            await outbox.add_async(
                session,
                new_event(
                    "provider.refund.created",
                    "/payment-provider",
                    {"id": refund["id"], "account": account, "charge_id": body["charge_id"]},
                    partitionkey=body["charge_id"],
                ),
            )
            return JSONResponse(refund, status_code=201)

        async def list_refunds(request: Request) -> JSONResponse:
            account = _account(request.headers.get("x-account"))
            key = request.query_params.get("idempotency_key")
            query = select(refunds_table).where(refunds_table.c.account == account)
            if key:
                query = query.where(refunds_table.c.idempotency_key == key)
            async with sessions() as session:
                found = [_refund(row) for row in await session.execute(query.order_by("id"))]
                record = await keys.lookup(session, account, key) if key else None
            in_flight = bool(record and record.in_flight)
            return JSONResponse({"count": len(found), "refunds": found, "in_flight": in_flight})

        api = Starlette(
            routes=[
                Route("/refunds", create_refund, methods=["POST"]),
                Route("/refunds", list_refunds, methods=["GET"]),
            ]
        )
        idempotent = IdempotencyMiddleware(
            api,
            engine=engine,
            routes=["POST /refunds"],
            scope_of=_scope_of,
            on_outcome=self._count,
            **self._key_options,
        )
        return _FaultLayer(idempotent)

    def _next_fault(self) -> tuple[Fault | None, Hold | None]:
        with self._lock:
            return self._faults.popleft() if self._faults else (None, None)

    def _count(self, outcome: Outcome) -> None:
        with self._lock:
            if outcome is Outcome.REPLAYED:
                self.replays += 1
            elif outcome is Outcome.CONFLICT:
                self.conflicts += 1
            elif outcome is Outcome.IN_PROGRESS:
                self.in_flight_rejections += 1


class _FaultLayer:
    """Applies a request's AFTER_COMMIT fault once the idempotency middleware has committed
    (it answers only after its commit), and turns ``_Drop`` into a dropped connection."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        slot = scope[FAULT_SLOT] = _Slot()

        async def faulty_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                if slot.fault is Fault.DROP_AFTER_COMMIT:
                    raise _Drop
                if slot.fault is Fault.HOLD_AFTER_COMMIT and slot.hold is not None:
                    slot.hold.reached.set()
                    await asyncio.to_thread(slot.hold.released.wait, HOLD_LIMIT_S)
            await send(message)

        try:
            await self.app(scope, receive, faulty_send)
        except _Drop:
            # uvicorn closes a connection whose response started and then failed: the client
            # reads a status line and a body cut short, i.e. no usable reply
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-length", b"1")],
                }
            )
            raise


def _scope_of(request: RequestInfo) -> str:
    return _account(request.headers.get("x-account"))


def _account(header: str | None) -> str:
    return header or "default"


def _refund(row: Any) -> dict[str, Any]:
    return {
        "id": f"re_{row.id:06d}",
        "account": row.account,
        "charge_id": row.charge_id,
        "amount_cents": row.amount_cents,
        "currency": row.currency,
        "idempotency_key": row.idempotency_key,
        "status": row.status,
    }


def _valid_body(raw: bytes) -> dict[str, Any] | None:
    import json

    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    amount = body.get("amount_cents")
    if not isinstance(body.get("charge_id"), str) or not isinstance(body.get("currency"), str):
        return None
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        return None
    return {"charge_id": body["charge_id"], "amount_cents": amount, "currency": body["currency"]}


class _DropFilter(logging.Filter):
    """Keeps uvicorn from logging an injected drop as an application error."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, _Drop)


def _quiet_drops() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DropFilter) for f in logger.filters):
        logger.addFilter(_DropFilter())
