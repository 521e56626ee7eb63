"""The agent's client of the payment provider, and its reconciler.

What each failure means for the operation is decided here, where the protocol is known:
nothing sent (connection refused) or 409/429/503 is transient; 400/422 are permanent; a reply
lost after the request went out, or a 5xx, leaves the outcome unknown.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from typing import Any
from urllib.parse import quote, urlsplit

from outboxkit.actions import Absent, Found, OperationRecord, ReconcileOutcome, Unclear
from outboxkit.outbox import OutcomeUnknownError, PermanentError, TransientError

TRANSIENT_STATUSES = {409, 429, 503}


class PaymentsClient:
    """Refunds through the provider's HTTP API, for one merchant account."""

    def __init__(self, base_url: str, account: str, timeout_s: float = 30.0) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.account = account
        self.timeout_s = timeout_s

    async def refund(
        self, idempotency_key: str, *, charge_id: str, amount_cents: int, currency: str
    ) -> dict[str, Any]:
        """Create a refund and return the provider's record of it.

        ``idempotency_key`` goes out as the ``Idempotency-Key`` header (a step passes
        ``current_step().idempotency_key``: the operation key plus its generation).
        """
        body = {"charge_id": charge_id, "amount_cents": amount_cents, "currency": currency}
        status, response = await asyncio.to_thread(
            self._call, "POST", "/refunds", body, {"Idempotency-Key": idempotency_key}
        )
        if status in (200, 201):
            return dict(response)
        if status in TRANSIENT_STATUSES:
            raise TransientError(f"provider answered {status}")
        if 400 <= status < 500:
            raise PermanentError(f"provider refused the refund with {status}")
        raise OutcomeUnknownError(f"provider answered {status}; the refund may exist")

    async def reconcile(self, operation: OperationRecord) -> ReconcileOutcome:
        """Look the refund up by the Idempotency-Key its generation sent (a reconciler)."""
        key = quote(operation.idempotency_key, safe="")
        path = f"/refunds?idempotency_key={key}"
        status, response = await asyncio.to_thread(self._call, "GET", path, None, {})
        if status != 200:
            return Unclear(f"lookup answered {status}")
        if response["refunds"]:
            refund = response["refunds"][0]
            return Found(result=refund, external_ref=refund["id"])
        if response["in_flight"]:
            return Unclear("a request with this key is still being processed")
        return Absent("no refund with this Idempotency-Key and none in flight")

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str]
    ) -> tuple[int, Any]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            try:
                connection.connect()
            except OSError as error:  # nothing was sent
                raise TransientError(f"provider unreachable: {type(error).__name__}") from error
            payload = None if body is None else json.dumps(body).encode()
            try:
                connection.request(
                    method,
                    path,
                    body=payload,
                    headers={"Content-Type": "application/json", "X-Account": self.account}
                    | headers,
                )
                response = connection.getresponse()
                data = response.read()
            except (http.client.HTTPException, OSError) as error:
                raise OutcomeUnknownError(
                    f"no reply from the provider ({type(error).__name__})"
                ) from error
            return response.status, json.loads(data) if data else None
        finally:
            connection.close()
