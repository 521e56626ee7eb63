"""The supplier's ERP on loopback HTTP: suppliers, price quotes that expire, purchase orders.

A fake, but a real HTTP service (its state in memory, behind a lock), with the behaviours
that matter to a buyer's workflow:

- ``GET /suppliers/{id}``: the supplier's record (status, currency, catalogue, version);
- ``POST /quotes``: a price quote for items, valid ``quote_ttl_s`` on the service's clock;
  ``GET /quotes/{id}`` says whether it is still ``valid`` or ``expired``;
- ``POST /orders`` with an ``Idempotency-Key``: issues one order for a valid quote (the same key
  replays the same order; an expired quote is refused with 410, a changed one with 409);
  ``GET /orders?idempotency_key=K`` finds it by key, ``POST /orders/{id}/cancel`` cancels it.

Faults, injected from Python: the next order commits and then the gateway answers 504
(:attr:`Fault.GATEWAY_TIMEOUT_AFTER_COMMIT`) or the reply is held
(:attr:`Fault.HOLD_AFTER_COMMIT`); :meth:`SupplierService.expire_quote` (an expired price) and
:meth:`SupplierService.change_quote` (the record changed after it was approved).
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from examples.purchase_order.loopback import LoopbackServer

DAY_S = 24 * 3600.0
HOLD_LIMIT_S = 120.0  # a held reply goes out by itself, so a forgotten hold cannot hang

CATALOGUE: dict[str, dict[str, Any]] = {
    "SUP-0042": {
        "name": "Nordpaper GmbH",
        "status": "active",
        "currency": "EUR",
        "catalogue": {"PAPER-A4-80G": 2_450, "TONER-K-XL": 8_990, "PEN-BLUE-50": 1_275},
    },
    "SUP-0099": {
        "name": "Blocked Supplies Ltd",
        "status": "blocked",
        "currency": "EUR",
        "catalogue": {"PAPER-A4-80G": 1_990},
    },
}
"""The suppliers the ERP knows, with their unit prices in cents."""


class Fault(Enum):
    """A misbehaviour applied to the next new order."""

    GATEWAY_TIMEOUT_AFTER_COMMIT = "gateway-timeout-after-commit"
    HOLD_AFTER_COMMIT = "hold-after-commit"


@dataclass
class Hold:
    """A reply paused after its order committed: ``reached`` is set when it gets there."""

    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        """Let the reply go out."""
        self.released.set()


class SupplierService:
    """The ERP's state and its HTTP server; use as a context manager.

    ``clock`` (seconds since the epoch) decides when quotes expire; share the workflow
    engine's business clock with it to move both through days of waiting.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        quote_ttl_s: float = 7 * DAY_S,
        port: int = 0,
    ) -> None:
        self.clock = clock
        self.quote_ttl_s = quote_ttl_s
        self._lock = threading.Lock()
        self._suppliers = copy.deepcopy(CATALOGUE)
        for record in self._suppliers.values():
            record["version"] = 1
        self._quotes: dict[str, dict[str, Any]] = {}
        self._quote_keys: dict[str, str] = {}
        self._orders: dict[str, dict[str, Any]] = {}
        self._order_keys: dict[str, tuple[str, str]] = {}  # key -> (body hash, order id)
        self._cancel_keys: dict[str, str] = {}
        self._faults: deque[tuple[Fault, Hold | None]] = deque()
        self.requests: list[str] = []
        """Every request as ``"METHOD /path"``, in arrival order."""
        self.replays = 0
        self._server = LoopbackServer(self.app(), port=port)

    @property
    def url(self) -> str:
        """Base URL of the ERP."""
        return self._server.url

    def __enter__(self) -> SupplierService:
        self._server.start()
        return self

    def __exit__(self, *_: object) -> None:
        with self._lock:
            holds = [hold for _, hold in self._faults if hold is not None]
        for hold in holds:
            hold.release()
        self._server.close()

    # -- faults and counts, from Python ------------------------------------------------------

    def inject(self, fault: Fault) -> Hold | None:
        """Apply ``fault`` to the next new order; a hold fault returns its hold."""
        hold = Hold() if fault is Fault.HOLD_AFTER_COMMIT else None
        with self._lock:
            self._faults.append((fault, hold))
        return hold

    def expire_quote(self, quote_id: str) -> None:
        """The supplier withdraws the price now (an expired price)."""
        with self._lock:
            self._quotes[quote_id]["expires_at"] = self.clock()

    def change_quote(self, quote_id: str, surcharge_cents: int) -> None:
        """The supplier revises the quote (the record changed): a new total, a new version."""
        with self._lock:
            quote = self._quotes[quote_id]
            quote["total_cents"] += surcharge_cents
            quote["surcharge_cents"] = quote.get("surcharge_cents", 0) + surcharge_cents
            quote["version"] += 1

    def orders(self) -> list[dict[str, Any]]:
        """The orders issued so far, oldest first."""
        with self._lock:
            return [dict(order) for order in self._orders.values()]

    def quotes(self) -> list[dict[str, Any]]:
        """The quotes given so far, oldest first."""
        with self._lock:
            return [self._quote_view(quote) for quote in self._quotes.values()]

    # -- the HTTP API ------------------------------------------------------------------------

    def app(self) -> Starlette:
        """The ERP's ASGI app."""
        return Starlette(
            routes=[
                Route("/suppliers/{supplier_id}", self._get_supplier, methods=["GET"]),
                Route("/quotes", self._create_quote, methods=["POST"]),
                Route("/quotes/{quote_id}", self._get_quote, methods=["GET"]),
                Route("/orders", self._create_order, methods=["POST"]),
                Route("/orders", self._find_orders, methods=["GET"]),
                Route("/orders/{order_id}", self._get_order, methods=["GET"]),
                Route("/orders/{order_id}/cancel", self._cancel_order, methods=["POST"]),
            ]
        )

    def _log(self, request: Request) -> None:
        with self._lock:
            self.requests.append(f"{request.method} {request.url.path}")

    async def _get_supplier(self, request: Request) -> JSONResponse:
        self._log(request)
        supplier_id = request.path_params["supplier_id"]
        with self._lock:
            record = self._suppliers.get(supplier_id)
            if record is None:
                return JSONResponse({"error": "no such supplier"}, status_code=404)
            return JSONResponse({"id": supplier_id, **copy.deepcopy(record)})

    async def _create_quote(self, request: Request) -> JSONResponse:
        self._log(request)
        body = await _json(request)
        key = request.headers.get("idempotency-key")
        with self._lock:
            if key and key in self._quote_keys:
                return JSONResponse(self._quote_view(self._quotes[self._quote_keys[key]]))
            supplier = self._suppliers.get(str(body.get("supplier")))
            if supplier is None:
                return JSONResponse({"error": "no such supplier"}, status_code=404)
            if supplier["status"] != "active":
                return JSONResponse({"error": "supplier not active"}, status_code=422)
            try:
                lines = [
                    {
                        "sku": item["sku"],
                        "qty": int(item["qty"]),
                        "unit_price_cents": supplier["catalogue"][item["sku"]],
                    }
                    for item in body["items"]
                ]
            except (KeyError, TypeError, ValueError):
                return JSONResponse({"error": "unknown item"}, status_code=422)
            quote_id = f"Q-{len(self._quotes) + 1:04d}"
            quote = {
                "id": quote_id,
                "supplier": body["supplier"],
                "currency": supplier["currency"],
                "items": lines,
                "total_cents": sum(line["qty"] * line["unit_price_cents"] for line in lines),
                "expires_at": self.clock() + self.quote_ttl_s,
                "version": 1,
            }
            self._quotes[quote_id] = quote
            if key:
                self._quote_keys[key] = quote_id
            return JSONResponse(self._quote_view(quote), status_code=201)

    async def _get_quote(self, request: Request) -> JSONResponse:
        self._log(request)
        with self._lock:
            quote = self._quotes.get(request.path_params["quote_id"])
            if quote is None:
                return JSONResponse({"error": "no such quote"}, status_code=404)
            return JSONResponse(self._quote_view(quote))

    def _quote_view(self, quote: dict[str, Any]) -> dict[str, Any]:
        status = "valid" if self.clock() < quote["expires_at"] else "expired"
        return {**copy.deepcopy(quote), "status": status}

    async def _create_order(self, request: Request) -> JSONResponse:
        self._log(request)
        key = request.headers.get("idempotency-key")
        if not key:
            return JSONResponse({"error": "an Idempotency-Key is required"}, status_code=400)
        raw = await request.body()
        body = await _json(request)
        with self._lock:
            known = self._order_keys.get(key)
            if known is not None:
                if known[0] != raw.decode():
                    return JSONResponse({"error": "key reused with another body"}, status_code=422)
                self.replays += 1
                return JSONResponse(dict(self._orders[known[1]]))
            quote = self._quotes.get(str(body.get("quote_id")))
            if quote is None:
                return JSONResponse({"error": "no such quote"}, status_code=404)
            if self.clock() >= quote["expires_at"]:
                return JSONResponse({"error": "the quote has expired"}, status_code=410)
            if body.get("total_cents") != quote["total_cents"]:
                return JSONResponse({"error": "the quote has changed"}, status_code=409)
            order_id = f"SO-{len(self._orders) + 1:06d}"
            order = {
                "id": order_id,
                "po": body.get("po"),
                "quote_id": quote["id"],
                "supplier": quote["supplier"],
                "currency": quote["currency"],
                "items": copy.deepcopy(quote["items"]),
                "total_cents": quote["total_cents"],
                "idempotency_key": key,
                "status": "open",
            }
            self._orders[order_id] = order
            self._order_keys[key] = (raw.decode(), order_id)  # committed from here on
            fault, hold = self._faults.popleft() if self._faults else (None, None)
            reply = dict(order)
        if fault is Fault.GATEWAY_TIMEOUT_AFTER_COMMIT:
            return JSONResponse({"error": "gateway timeout"}, status_code=504)
        if hold is not None:
            hold.reached.set()
            await asyncio.to_thread(hold.released.wait, HOLD_LIMIT_S)
        return JSONResponse(reply, status_code=201)

    async def _find_orders(self, request: Request) -> JSONResponse:
        self._log(request)
        key = request.query_params.get("idempotency_key")
        with self._lock:
            found = [
                dict(order)
                for order in self._orders.values()
                if key is None or order["idempotency_key"] == key
            ]
        return JSONResponse({"orders": found})

    async def _get_order(self, request: Request) -> JSONResponse:
        self._log(request)
        with self._lock:
            order = self._orders.get(request.path_params["order_id"])
            if order is None:
                return JSONResponse({"error": "no such order"}, status_code=404)
            return JSONResponse(dict(order))

    async def _cancel_order(self, request: Request) -> JSONResponse:
        self._log(request)
        key = request.headers.get("idempotency-key")
        with self._lock:
            order = self._orders.get(request.path_params["order_id"])
            if order is None:
                return JSONResponse({"error": "no such order"}, status_code=404)
            if order["status"] == "cancelled" and self._cancel_keys.get(order["id"]) == key:
                self.replays += 1
                return JSONResponse(dict(order))
            if order["status"] != "open":
                return JSONResponse({"error": f"order is {order['status']}"}, status_code=409)
            order["status"] = "cancelled"
            self._cancel_keys[order["id"]] = key or ""
            return JSONResponse(dict(order))


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
