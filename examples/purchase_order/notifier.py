"""The notification service (mail to the requester) on loopback HTTP, and its client.

``POST /notifications`` with an ``Idempotency-Key`` sends one notification (the same key
replays it); ``GET /notifications?idempotency_key=K`` finds it. :meth:`NotifierService.fail_next`
makes the next requests fail with 503 before anything is sent, as a mail relay under load does.
The workflow sends it as an effect of its own, in a state of its own: retrying it never
touches the order.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from urllib.parse import quote

from outboxkit.actions import Absent, Found, OperationRecord, ReconcileOutcome, Unclear
from outboxkit.outbox import OutcomeUnknownError, PermanentError, TransientError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from examples.purchase_order.loopback import LoopbackServer, call_json


class NotifierService:
    """The notifier's state and its HTTP server; use as a context manager."""

    def __init__(self, port: int = 0) -> None:
        self._lock = threading.Lock()
        self._sent: dict[str, dict[str, Any]] = {}
        self._failures = 0
        self.attempts = 0
        """Every ``POST /notifications`` received, failed ones included."""
        self._server = LoopbackServer(self.app(), port=port)

    @property
    def url(self) -> str:
        """Base URL of the notifier."""
        return self._server.url

    def __enter__(self) -> NotifierService:
        self._server.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.close()

    def fail_next(self, times: int) -> None:
        """Answer the next ``times`` sends with 503 (nothing sent)."""
        with self._lock:
            self._failures = times

    def sent(self) -> list[dict[str, Any]]:
        """The notifications sent, oldest first."""
        with self._lock:
            return [dict(message) for message in self._sent.values()]

    def app(self) -> Starlette:
        """The notifier's ASGI app."""

        async def send(request: Request) -> JSONResponse:
            key = request.headers.get("idempotency-key")
            body = await request.json()
            with self._lock:
                self.attempts += 1
                if not key:
                    return JSONResponse({"error": "an Idempotency-Key is required"}, 400)
                if self._failures > 0:
                    self._failures -= 1
                    return JSONResponse({"error": "mail relay busy"}, status_code=503)
                if key not in self._sent:
                    number = len(self._sent) + 1
                    self._sent[key] = {"id": f"N-{number:04d}", "idempotency_key": key, **body}
                return JSONResponse(dict(self._sent[key]), status_code=201)

        async def find(request: Request) -> JSONResponse:
            key = request.query_params.get("idempotency_key", "")
            with self._lock:
                found = [dict(self._sent[key])] if key in self._sent else []
            return JSONResponse({"notifications": found})

        return Starlette(
            routes=[
                Route("/notifications", send, methods=["POST"]),
                Route("/notifications", find, methods=["GET"]),
            ]
        )


class NotifierClient:
    """Sends notifications through the notifier at ``base_url``."""

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s

    async def send(self, idempotency_key: str, message: dict[str, Any]) -> dict[str, Any]:
        """Send ``message`` (``recipient``, ``subject``, ...) once for ``idempotency_key``."""
        status, reply = await asyncio.to_thread(
            call_json,
            self.base_url,
            "POST",
            "/notifications",
            message,
            {"Idempotency-Key": idempotency_key},
            self.timeout_s,
        )
        if status in (200, 201):
            return dict(reply)
        if status in (429, 503):
            raise TransientError(f"notifier answered {status}")
        if 400 <= status < 500:
            raise PermanentError(f"notifier refused the notification with {status}")
        raise OutcomeUnknownError(f"notifier answered {status}")

    async def find(self, operation: OperationRecord) -> ReconcileOutcome:
        """Look a notification up by its key (the notify effect's reconciler)."""
        key = quote(operation.idempotency_key, safe="")
        status, body = await asyncio.to_thread(
            call_json,
            self.base_url,
            "GET",
            f"/notifications?idempotency_key={key}",
            None,
            None,
            self.timeout_s,
        )
        if status != 200:
            return Unclear(f"notification lookup answered {status}")
        if body["notifications"]:
            found = body["notifications"][0]
            return Found(result=found, external_ref=found["id"])
        return Absent("no notification with this Idempotency-Key")
