"""A payment provider on loopback HTTP that honours ``Idempotency-Key`` like real ones do.

``POST /refunds`` with ``Idempotency-Key`` and ``X-Account`` headers and a JSON body
``{"charge_id", "amount_cents", "currency"}``:

- a new key creates one refund (201) and stores the response;
- the same key with the same body replays the stored response with ``Idempotent-Replay: true``;
- the same key with another body: 422; while the first request is still processing: 409.

``GET /refunds?idempotency_key=K`` lists the account's refunds (filtered by key) and whether a
request with that key is in flight. Keys are scoped per account, as at Stripe. Faults can be
injected from Python (:meth:`PaymentProvider.inject`): drop the connection before or after
committing the refund, or hold the request at either point until released.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

HOLD_LIMIT_S = 120.0  # a held request gives up by itself, so a forgotten hold cannot hang


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
class _Entry:
    body_hash: str
    in_flight: bool = True
    status: int = 0
    response: dict[str, Any] = field(default_factory=dict)


class PaymentProvider:
    """The provider's state and its HTTP server; use as a context manager."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._refunds: list[dict[str, Any]] = []
        self._faults: deque[tuple[Fault, Hold | None]] = deque()
        self._holds: list[Hold] = []
        self.replays = 0
        self.conflicts = 0
        self.in_flight_rejections = 0
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43121``."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> PaymentProvider:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Release every hold and stop the server."""
        with self._lock:
            holds = list(self._holds)
        for hold in holds:
            hold.release()
        self._server.shutdown()
        self._server.server_close()

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
        with self._lock:
            return [dict(r) for r in self._refunds if account in (None, r["account"])]

    def refund_count(self, account: str | None = None) -> int:
        """How many refunds were committed (of one account, or all)."""
        return len(self.refunds(account))

    # -- request handling (called on the server's threads) ----------------------------------

    def _create(self, account: str, key: str, body: dict[str, Any]) -> tuple[int, dict, bool]:
        """Return (status, response, replayed), or raise _Drop for a dropped connection."""
        body_hash = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        with self._lock:
            entry = self._entries.get((account, key))
            if entry is not None:
                if entry.body_hash != body_hash:
                    self.conflicts += 1
                    return 422, {"error": "idempotency key reused with another request"}, False
                if entry.in_flight:
                    self.in_flight_rejections += 1
                    return 409, {"error": "a request with this key is in progress"}, False
                self.replays += 1
                return entry.status, entry.response, True
            entry = _Entry(body_hash)
            self._entries[(account, key)] = entry
            fault, hold = self._faults.popleft() if self._faults else (None, None)
        if fault is Fault.DROP_BEFORE_COMMIT:
            with self._lock:
                del self._entries[(account, key)]
            raise _Drop
        if fault is Fault.HOLD_BEFORE_COMMIT and hold is not None:
            hold.reached.set()
            hold.released.wait(HOLD_LIMIT_S)
        with self._lock:
            refund = {
                "id": f"re_{len(self._refunds) + 1:06d}",
                "account": account,
                "charge_id": body["charge_id"],
                "amount_cents": body["amount_cents"],
                "currency": body["currency"],
                "idempotency_key": key,
                "status": "succeeded",
            }
            self._refunds.append(refund)
            entry.in_flight, entry.status, entry.response = False, 201, dict(refund)
        if fault is Fault.DROP_AFTER_COMMIT:
            raise _Drop
        if fault is Fault.HOLD_AFTER_COMMIT and hold is not None:
            hold.reached.set()
            hold.released.wait(HOLD_LIMIT_S)
        return 201, dict(refund), False

    def _lookup(self, account: str, key: str | None) -> dict[str, Any]:
        with self._lock:
            refunds = [
                dict(r)
                for r in self._refunds
                if r["account"] == account and key in (None, r["idempotency_key"])
            ]
            entry = self._entries.get((account, key)) if key else None
            return {
                "count": len(refunds),
                "refunds": refunds,
                "in_flight": bool(entry and entry.in_flight),
            }


class _Drop(Exception):
    """Close the connection without a reply."""


def _handler_for(provider: PaymentProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            if urlsplit(self.path).path != "/refunds":
                self._reply(404, {"error": "not found"})
                return
            key = self.headers.get("Idempotency-Key")
            account = self.headers.get("X-Account", "default")
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = _valid_body(raw)
            if not key or body is None:
                self._reply(400, {"error": "Idempotency-Key and a valid refund body required"})
                return
            try:
                status, response, replayed = provider._create(account, key, body)
            except _Drop:
                self._drop()
                return
            self._reply(status, response, {"Idempotent-Replay": "true"} if replayed else {})

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path != "/refunds":
                self._reply(404, {"error": "not found"})
                return
            key = parse_qs(url.query).get("idempotency_key", [None])[0]
            account = self.headers.get("X-Account", "default")
            self._reply(200, provider._lookup(account, key))

        def _reply(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
            payload = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                self.close_connection = True  # the client went away while we were held

        def _drop(self) -> None:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: tests and the demo print what matters

    return Handler


def _valid_body(raw: bytes) -> dict[str, Any] | None:
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
