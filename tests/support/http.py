"""Serving an ASGI app with uvicorn on loopback, in the test's event loop or as a process."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from tests.support import REPO
from tests.support.kafka import wait_for
from tests.support.waits import scaled


@contextmanager
def listening_socket() -> Iterator[socket.socket]:
    """A TCP socket listening on 127.0.0.1 at a free port (kept across server restarts)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    try:
        yield sock
    finally:
        sock.close()


def url_of(sock: socket.socket) -> str:
    """``http://127.0.0.1:PORT`` of a listening socket."""
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn in this event loop; yield its base URL."""
    with listening_socket() as sock:
        config = uvicorn.Config(
            app, lifespan="off", access_log=False, log_level="warning", timeout_graceful_shutdown=5
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        await wait_for(lambda: server.started or task.done(), bool, 30, "uvicorn to start")
        if task.done():
            task.result()
        try:
            yield url_of(sock)
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, scaled(30))


def start_server(
    app: str, sock: socket.socket, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """Run ``python -m uvicorn APP`` as a child process serving the inherited ``sock``."""
    with open(log, "ab") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "uvicorn", app, "--fd", str(sock.fileno()), "--no-access-log"],
            pass_fds=[sock.fileno()],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            stdout=output,
            stderr=subprocess.STDOUT,
        )


async def wait_until_serving(base_url: str, process: subprocess.Popen[bytes]) -> None:
    """Wait until the server answers ``GET /health`` (fail if the process died)."""

    async def probe() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}")
        try:
            async with httpx.AsyncClient(base_url=base_url, timeout=scaled(2)) as client:
                return (await client.get("/health")).status_code == 200
        except httpx.TransportError:
            return False

    await wait_for(probe, bool, 60, "the server to answer")
