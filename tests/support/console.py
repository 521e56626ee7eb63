"""Helpers of the console tests: serve the console on a free port (uvicorn in a thread), sign
in over HTTP, read a page's CSRF token."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import uvicorn
from outboxkit.console import ConsoleConfig, Tokens, create_app

VIEWER_TOKEN = "viewer-token-0123456789"
OPERATOR_TOKEN = "operator-token-0123456789"
TOKENS = Tokens.parse(
    [f"{VIEWER_TOKEN} viewer vera", f"{OPERATOR_TOKEN} operator otto"], "test tokens"
)
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def serving(config: ConsoleConfig) -> Iterator[str]:
    """The console on ``config``, served at the URL yielded until the block ends."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "the console did not start"
        assert time.monotonic() < deadline, "the console did not start in 30 s"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def csrf_of(html: str) -> str:
    """The first CSRF token of a page."""
    found = CSRF.search(html)
    assert found, "no CSRF token on the page"
    return found.group(1)


@contextlib.contextmanager
def signed_in(base: str, token: str) -> Iterator[httpx.Client]:
    """An HTTP client signed in with ``token`` (a cookie session, as a browser)."""
    with httpx.Client(base_url=base, timeout=60) as client:
        page = client.get("/login")
        response = client.post("/login", data={"csrf": csrf_of(page.text), "token": token})
        assert response.status_code == 303, response.text
        yield client


def follow_pages(client: httpx.Client, url: str, link_id: str = "next") -> Iterator[str]:
    """Each page of a keyset-paged list, from ``url`` along the link ``#link_id``."""
    following: str | None = url
    while following is not None:
        page = client.get(following).text
        yield page
        found = re.search(rf'id="{link_id}" href="([^"]+)"', page)
        following = found.group(1).replace("&amp;", "&") if found else None
