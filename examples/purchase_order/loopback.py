"""A JSON service on loopback HTTP (uvicorn in a thread), and the client call its clients share.

The fake services of this example (the supplier's ERP, the notifier) are real HTTP servers, so
a lost reply, a gateway timeout or a refusal crosses a real socket, as in production.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from outboxkit.outbox import OutcomeUnknownError, TransientError


class LoopbackServer:
    """Serves an ASGI app on 127.0.0.1 from a background thread; a context manager."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self._app = app
        self._socket = socket.create_server((host, port))
        self._server: uvicorn.Server | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43121``."""
        host, port = self._socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Start serving; return once the server accepts connections."""
        self._thread.start()
        self._started.wait(60)
        if self._error is not None:
            raise RuntimeError("the loopback server did not start") from self._error

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(30)
        self._socket.close()

    def _serve(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as error:  # reported by start()
            self._error = error
        finally:
            self._started.set()

    async def _run(self) -> None:
        config = uvicorn.Config(
            self._app,
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


def call_json(
    base_url: str,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> tuple[int, Any]:
    """One blocking HTTP call with a JSON body; returns ``(status, parsed reply)``.

    Nothing sent (the connection refused) raises :class:`TransientError`; a request sent whose
    reply never came raises :class:`OutcomeUnknownError`: it may have been carried out.
    """
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(
        parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout_s
    )
    try:
        try:
            connection.connect()
        except OSError as error:
            raise TransientError(f"{base_url} unreachable: {type(error).__name__}") from error
        payload = None if body is None else json.dumps(body).encode()
        try:
            connection.request(
                method,
                path,
                body=payload,
                headers={"Content-Type": "application/json", **(headers or {})},
            )
            response = connection.getresponse()
            data = response.read()
        except (http.client.HTTPException, OSError) as error:
            raise OutcomeUnknownError(
                f"no reply from {base_url} ({type(error).__name__})"
            ) from error
        return response.status, json.loads(data) if data else None
    finally:
        connection.close()
