"""The buyer's client of the supplier's ERP, and the reconciler of its orders.

What each answer means for an effect is decided here, where the protocol is known: a refusal
(404, 409, 410, 422) certainly created nothing (permanent); 429 and 503 are transient; a 504
from the gateway, any other 5xx or a reply lost after the request went out leave the outcome
unknown: the order may exist, so it is looked up by its key before anything is retried.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

from outboxkit.actions import Absent, Found, OperationRecord, ReconcileOutcome, Unclear
from outboxkit.outbox import OutcomeUnknownError, PermanentError, TransientError

from examples.purchase_order.loopback import call_json


class SupplierClient:
    """Calls the ERP at ``base_url``."""

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s

    async def supplier(self, supplier_id: str) -> dict[str, Any] | None:
        """The supplier's record, or ``None`` if the ERP does not know it."""
        status, body = await self._call("GET", f"/suppliers/{quote(supplier_id, safe='')}")
        if status == 404:
            return None
        return _read(status, body, "supplier lookup")

    async def request_quote(
        self, idempotency_key: str, *, supplier: str, items: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """A new price quote for ``items`` (the same key returns the same quote)."""
        body = {"supplier": supplier, "items": items}
        status, reply = await self._call(
            "POST", "/quotes", body, {"Idempotency-Key": idempotency_key}
        )
        return _written(status, reply, "quote")

    async def get_quote(self, quote_id: str) -> dict[str, Any]:
        """The quote as the supplier holds it now (``status``: ``valid`` or ``expired``)."""
        status, body = await self._call("GET", f"/quotes/{quote(quote_id, safe='')}")
        return _read(status, body, "quote lookup")

    async def issue_order(self, idempotency_key: str, order: dict[str, Any]) -> dict[str, Any]:
        """Issue the purchase order; ``idempotency_key`` goes out as ``Idempotency-Key``."""
        status, reply = await self._call(
            "POST", "/orders", order, {"Idempotency-Key": idempotency_key}
        )
        return _written(status, reply, "order")

    async def find_order(self, operation: OperationRecord) -> ReconcileOutcome:
        """Look an order up by the key its generation sent (the issue effect's reconciler)."""
        key = quote(operation.idempotency_key, safe="")
        status, body = await self._call("GET", f"/orders?idempotency_key={key}")
        if status != 200:
            return Unclear(f"order lookup answered {status}")
        if body["orders"]:
            order = body["orders"][0]
            return Found(result=order, external_ref=order["id"])
        return Absent("no order with this Idempotency-Key")

    async def get_order(self, order_id: str) -> dict[str, Any]:
        """The order as the supplier holds it now."""
        status, body = await self._call("GET", f"/orders/{quote(order_id, safe='')}")
        return _read(status, body, "order lookup")

    async def cancel_order(self, idempotency_key: str, order_id: str) -> dict[str, Any]:
        """Cancel an issued order (a new business action: the compensation of issuing it)."""
        status, reply = await self._call(
            "POST",
            f"/orders/{quote(order_id, safe='')}/cancel",
            {},
            {"Idempotency-Key": idempotency_key},
        )
        return _written(status, reply, "cancel")

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        return await asyncio.to_thread(
            call_json, self.base_url, method, path, body, headers, self.timeout_s
        )


def _written(status: int, body: Any, what: str) -> dict[str, Any]:
    """The reply to a write: the record, or the exception that says what it means."""
    if status in (200, 201):
        return dict(body)
    if status in (429, 503):
        raise TransientError(f"{what}: supplier answered {status}")
    if 400 <= status < 500:
        error = body.get("error") if isinstance(body, dict) else None
        raise PermanentError(f"{what} refused with {status}: {error}")
    raise OutcomeUnknownError(f"{what}: supplier answered {status}; it may have been carried out")


def _read(status: int, body: Any, what: str) -> dict[str, Any]:
    """The reply to a read: the record, or a transient error (reading again is harmless)."""
    if status == 200:
        return dict(body)
    raise TransientError(f"{what}: supplier answered {status}")
