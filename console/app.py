"""The console's ASGI application: sign-in, the security middleware, and every page's routes."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from outboxkit.console import (
    actions_page,
    dlq_page,
    other_pages,
    outbox_page,
    overview,
    workflows_page,
)
from outboxkit.console.context import HERE, Console, ConsoleConfig, console_of
from outboxkit.console.security import (
    CSRF_FIELD,
    HEADERS,
    LOGIN_COOKIE,
    SESSION_COOKIE,
    Principal,
    ProxyRefusal,
    csrf_matches,
    login_token,
)
from outboxkit.ops.access import OpsError, ops_engine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

OPEN_PATHS = ("/login", "/static/", "/favicon.ico")
ANONYMOUS = Principal("anonymous", "operator")
TENANT_PATHS = ("/actions", "/workflows")
"""What a principal limited to tenants may open: the pages of things that carry a tenant.
Outbox rows, dead letters, inbox entries and the audit trail carry none, so they stay closed."""


class Guard(BaseHTTPMiddleware):
    """Signs each request in (or sends it to the login page) and adds the security headers."""

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        console = console_of(request)
        response = await self._route(console, request, call_next)
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    async def _route(
        self,
        console: Console,
        request: Request,
        call_next: Callable[[Request], Awaitable[Response]],
    ) -> Response:
        path = request.url.path
        if path.startswith(OPEN_PATHS):
            return await call_next(request)
        session_id = request.cookies.get(SESSION_COOKIE)
        session = console.sessions.get(session_id)
        fresh: str | None = None
        proxy = console.config.proxy
        if proxy is not None:
            peer = request.client.host if request.client is not None else None
            try:
                named = proxy.identify(peer, request.headers)
            except ProxyRefusal as refusal:
                return HTMLResponse(str(refusal), status_code=403)
            if named is not None and (session is None or session.principal != named):
                fresh, session = console.sessions.open(named)
        if session is None and console.config.insecure_no_auth:
            fresh, session = console.sessions.open(ANONYMOUS)
        if session is None:
            if request.method in ("GET", "HEAD"):
                return RedirectResponse("/login", status_code=303)
            return HTMLResponse("sign in first", status_code=403)
        request.state.session = session
        request.state.principal = session.principal
        if session.principal.limited and not path.startswith((*TENANT_PATHS, "/logout")):
            if path == "/" and request.method in ("GET", "HEAD"):
                response: Response = RedirectResponse("/actions", status_code=303)
            else:
                response = console.render(
                    request,
                    "error.html",
                    status_code=403,
                    message=f"{session.principal.name} is limited to tenants: only agent "
                    "actions and workflows carry a tenant",
                )
        else:
            response = await call_next(request)
        if fresh is not None:
            _set_session_cookie(console, response, fresh)
        return response


def _set_session_cookie(console: Console, response: Response, session_id: str) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        session_id,
        httponly=True,
        samesite="strict",
        secure=console.config.secure_cookies,
        path="/",
    )


async def login_page(request: Request) -> Response:
    """The sign-in form: a token, typed once, posted in the body."""
    console = console_of(request)
    # A second GET (another tab, a favicon redirect) keeps the nonce: an open form stays valid.
    nonce = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(24)
    request.state.principal = None
    html = console.templates.get_template("login.html").render(
        csrf=login_token(console.login_secret, nonce),
        csrf_field=CSRF_FIELD,
        error=None,
        principal=None,
    )
    response = HTMLResponse(html)
    response.set_cookie(
        LOGIN_COOKIE, nonce, httponly=True, samesite="strict", path="/login",
        secure=console.config.secure_cookies,
    )  # fmt: skip
    return response


async def login(request: Request) -> Response:
    """Check the token; open a session."""
    console = console_of(request)
    form = await request.form()
    nonce = request.cookies.get(LOGIN_COOKIE, "")
    if not nonce or not csrf_matches(
        login_token(console.login_secret, nonce), form.get(CSRF_FIELD)
    ):
        return HTMLResponse("missing or wrong CSRF token", status_code=403)
    principal = console.tokens_find(str(form.get("token") or ""))
    if principal is None:
        html = console.templates.get_template("login.html").render(
            csrf=login_token(console.login_secret, nonce),
            csrf_field=CSRF_FIELD,
            error="unknown token",
            principal=None,
        )
        return HTMLResponse(html, status_code=401)
    session_id, _ = console.sessions.open(principal)
    response = RedirectResponse("/", status_code=303)
    _set_session_cookie(console, response, session_id)
    return response


async def logout(request: Request) -> Response:
    """Close the session (a POST with its CSRF token, like every change)."""
    console = console_of(request)
    session = request.state.session
    form = await request.form()
    if not csrf_matches(session.csrf, form.get(CSRF_FIELD)):
        raise HTTPException(403, "missing or wrong CSRF token")
    console.sessions.close(request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    return _error_page(request, error.status_code, str(error.detail))


async def _ops_error(request: Request, error: Exception) -> Response:
    return _error_page(request, 502, str(error))


def _error_page(request: Request, status: int, message: str) -> Response:
    console = console_of(request)
    if getattr(request.state, "principal", None) is None:
        return HTMLResponse(message, status_code=status)
    return console.render(request, "error.html", status_code=status, message=message)


def create_app(config: ConsoleConfig) -> Starlette:
    """The console on ``config``'s sources; serve it with any ASGI server."""
    console = Console(config, ops_engine(config.db_url, config.timeout))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        console.start()
        try:
            yield
        finally:
            await console.close()

    routes = [
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        *overview.routes,
        *outbox_page.routes,
        *dlq_page.routes,
        *actions_page.routes,
        *workflows_page.routes,
        *other_pages.routes,
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Guard)],
        exception_handlers={HTTPException: _http_error, OpsError: _ops_error},
        lifespan=lifespan,
    )
    app.state.console = console
    return app
