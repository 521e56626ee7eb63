"""One small HTTP server per process: ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

Kubernetes probes read 200-399 as success: ``/healthz`` answers 200 while the process's event
loop is alive and 503 when it stalled; ``/readyz`` answers 200 when the process can work
(database and broker reachable, work assigned) and 503 with a short JSON body naming what is
not ready. Without a :class:`~outboxkit.outbox.readiness.Readiness`, both answer 200.
The server binds 127.0.0.1 unless told otherwise (in a container: ``--metrics-address
0.0.0.0``). See docs/observability.md#probes.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from outboxkit.outbox.errors import OutboxError
from outboxkit.outbox.readiness import Readiness
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

DEFAULT_ADDRESS = "127.0.0.1"


class ProbeServer:
    """A running server; :meth:`close` stops it (processes just exit)."""

    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def address(self) -> str:
        """The address it listens on."""
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        """The port it listens on (useful when started on port 0)."""
        port: int = self._server.server_address[1]
        return port

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_metrics(
    port: int,
    address: str = DEFAULT_ADDRESS,
    readiness: Readiness | None = None,
    registry: CollectorRegistry = REGISTRY,
) -> ProbeServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``address:port`` in a daemon thread.

    A port that is taken or an address that cannot be bound is one :class:`OutboxError` line.
    """
    handler = type("_Handler", (_Handler,), {"readiness": readiness, "registry": registry})
    try:
        server = ThreadingHTTPServer((address, port), handler)
    except OSError as error:
        raise OutboxError(
            f"cannot serve metrics on {address}:{port}: {error.strerror or error}"
        ) from error
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="outboxkit-metrics", daemon=True)
    thread.start()
    return ProbeServer(server, thread)


class _Handler(BaseHTTPRequestHandler):
    readiness: Readiness | None = None
    registry: CollectorRegistry = REGISTRY

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz" and self.readiness is not None:
            self._send_json(*self.readiness.alive())
        elif path == "/readyz" and self.readiness is not None:
            self._send_json(*self.readiness.ready())
        elif path in ("/healthz", "/readyz"):
            self._send_json(True, {"status": "ok"})
        else:
            self._send(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _send_json(self, ok: bool, body: dict[str, Any]) -> None:
        payload = (json.dumps(body, sort_keys=True) + "\n").encode()
        self._send(200 if ok else 503, payload, "application/json")

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Probes come every few seconds: no access log."""
