"""What every page of the console shares: the configuration, the database engine, sessions,
templates; and the helpers that render a page and guard a change."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from outboxkit.actions.events import DEFAULT_TOPIC
from outboxkit.console import audit
from outboxkit.console.kafka_link import KafkaLink
from outboxkit.console.report_cache import SharedReport
from outboxkit.console.security import (
    CSRF_FIELD,
    Principal,
    ProxyIdentity,
    Sessions,
    Tokens,
    csrf_matches,
)
from outboxkit.ops.access import DEFAULT_TIMEOUT_S
from outboxkit.ops.formatting import format_age, format_ms, parse_keyset
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.workflows import WorkflowEngine
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse

HERE = Path(__file__).parent
PAGE_SIZE = 50
REPORT_TTL_S = 2.0
REPORT_STALE_S = 30.0
DLQ_SAMPLE = 1000


@dataclass
class ConsoleConfig:
    """How the console reaches its sources and who may use it.

    ``workflow_engine`` builds the application's engine (``--app``), for the workflow decisions;
    ``None``: the workflow pages only read. ``insecure_no_auth`` lets anyone in as an operator
    (the CLI allows it on a loopback address only). ``proxy``: identity from a trusted reverse
    proxy's header, beside the tokens. ``report_ttl_s``: how long the overview's report is
    shared by its viewers (0: each viewer reads its own); for ``report_stale_s`` more a viewer
    is given it while a new one is read (:mod:`~outboxkit.console.report_cache`).
    ``dlq_sample``: a dead-letter topic's page groups its newest ``dlq_sample`` letters (the
    actions still cover the whole filter).
    """

    db_url: str
    kafka: KafkaSettings
    tokens: Tokens = field(default_factory=Tokens)
    proxy: ProxyIdentity | None = None
    insecure_no_auth: bool = False
    dlq_topics: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT_S
    actions_topic: str = DEFAULT_TOPIC
    workflow_engine: Callable[[], WorkflowEngine] | None = None
    refresh_s: float = 5.0
    page_size: int = PAGE_SIZE
    secure_cookies: bool = False
    report_ttl_s: float = REPORT_TTL_S
    report_stale_s: float = REPORT_STALE_S
    dlq_sample: int = DLQ_SAMPLE


class Console:
    """The running console's state (one per app): its sources' clients, kept for the
    process's life (:meth:`start`, :meth:`close`), sessions, templates."""

    def __init__(self, config: ConsoleConfig, engine: AsyncEngine) -> None:
        self.config = config
        self.engine = engine
        self.kafka = KafkaLink(config.kafka, config.timeout)
        self._reports: dict[str, SharedReport[Any]] = {}
        self.sessions = Sessions()
        self.login_secret = secrets.token_bytes(32)
        self._workflow_engine: WorkflowEngine | None = None
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(["html"]),
            enable_async=False,
        )
        self.templates.filters["time"] = format_ms
        self.templates.filters["age"] = format_age

    def tokens_find(self, token: str) -> Principal | None:
        """The principal of a typed token."""
        return self.config.tokens.find(token.strip()) if token.strip() else None

    def workflow_engine(self) -> WorkflowEngine | None:
        """The application's engine, built on first use; ``None`` without ``--app``."""
        if self._workflow_engine is None and self.config.workflow_engine is not None:
            self._workflow_engine = self.config.workflow_engine()
        return self._workflow_engine

    def shared_report(self, name: str, read: Callable[[], Awaitable[Any]]) -> SharedReport[Any]:
        """The report ``name``, read by ``read`` and shared by the viewers of the same
        ``report_ttl_s`` seconds (and given while stale for ``report_stale_s`` more)."""
        if name not in self._reports:
            config = self.config
            self._reports[name] = SharedReport(read, config.report_ttl_s, config.report_stale_s)
        return self._reports[name]

    def start(self) -> None:
        """Connect to the broker in the background (the server's start-up)."""
        self.kafka.start()

    async def close(self) -> None:
        """Disconnect from the broker; dispose of the database engines."""
        for report in self._reports.values():
            await report.close()
        await self.kafka.close()
        await self.engine.dispose()
        wf = self._workflow_engine
        bind = None if wf is None else wf.sessions.kw.get("bind")
        if isinstance(bind, AsyncEngine):
            await bind.dispose()

    def render(
        self, request: Request, template: str, status_code: int = 200, **values: Any
    ) -> HTMLResponse:
        """``template`` with the principal, CSRF token and ``values``."""
        principal: Principal = request.state.principal
        session = getattr(request.state, "session", None)
        html = self.templates.get_template(template).render(
            principal=principal,
            csrf=session.csrf if session is not None else "",
            csrf_field=CSRF_FIELD,
            path=request.url.path,
            refresh_s=self.config.refresh_s,
            **values,
        )
        return HTMLResponse(html, status_code=status_code)

    async def change_form(self, request: Request) -> tuple[Principal, FormData]:
        """The form of a state-changing POST, once its CSRF token and the operator role are
        checked (403 otherwise)."""
        session = getattr(request.state, "session", None)
        form = await request.form()
        if session is None or not csrf_matches(session.csrf, form.get(CSRF_FIELD)):
            raise HTTPException(403, "missing or wrong CSRF token")
        principal: Principal = request.state.principal
        if not principal.may_act:
            raise HTTPException(403, f"{principal.name} is a viewer: viewers cannot act")
        return principal, form

    async def audit(
        self,
        principal: Principal,
        *,
        action: str,
        target: str,
        filter: dict[str, Any],
        count: int | None,
        reason: str,
        outcome: str,
    ) -> None:
        """Record an action in the audit trail."""
        await audit.record(
            self.engine,
            actor=principal.name,
            role=principal.role,
            action=action,
            target=target,
            filter=filter,
            count=count,
            reason=reason,
            outcome=outcome,
        )


def console_of(request: Request) -> Console:
    """The console serving ``request``."""
    console: Console = request.app.state.console
    return console


def require_tenant(request: Request, tenant: str) -> None:
    """403 unless the signed-in principal may see and act on ``tenant``."""
    principal: Principal = request.state.principal
    if not principal.allows(tenant):
        raise HTTPException(403, f"{principal.name} is not allowed tenant {tenant!r}")


def tenants_of(request: Request, asked: str | None) -> tuple[str | None, frozenset[str] | None]:
    """The tenant a list is filtered to (``asked``, 403 when not allowed) and the tenants the
    principal is limited to (``None``: all)."""
    if asked is not None:
        require_tenant(request, asked)
    principal: Principal = request.state.principal
    return asked, principal.tenants


def reason_of(form: FormData) -> str:
    """The form's ``reason``, required for every action (400 without one)."""
    reason = str(form.get("reason") or "").strip()
    if not reason:
        raise HTTPException(400, "a reason is required")
    return reason[:1000]


def text_of(form: FormData | Any, name: str) -> str | None:
    """A form or query field as stripped text, ``None`` when absent or empty."""
    value = form.get(name)
    text = str(value).strip() if value is not None else ""
    return text or None


def keyset_of(form: FormData | Any, name: str) -> tuple[int, int] | None:
    """A keyset field ``VALUE.ID`` as two integers (400 when it is not one), ``None`` when
    absent."""
    text = text_of(form, name)
    if text is None:
        return None
    try:
        return parse_keyset(text)
    except ValueError:
        raise HTTPException(400, f"{name} is VALUE.ID") from None


def int_of(form: FormData | Any, name: str) -> int | None:
    """A form or query field as an integer (400 when it is not one)."""
    text = text_of(form, name)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise HTTPException(400, f"{name} must be an integer") from None
