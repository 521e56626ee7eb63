"""Serving Prometheus metrics over HTTP from an outboxkit process."""

from __future__ import annotations

from outboxkit.outbox.errors import OutboxError
from prometheus_client import start_http_server


def serve_metrics(port: int, address: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` on ``port`` in a background thread; a taken port is one error line."""
    try:
        start_http_server(port, addr=address)
    except OSError as error:
        raise OutboxError(f"cannot serve metrics on port {port}: {error.strerror}") from error
