"""The console's protections over real HTTP on real PostgreSQL and Kafka: sign-in, roles, CSRF,
security headers, nothing secret in a page or URL, identity from a trusted reverse proxy only,
and principals limited to tenants."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from outboxkit.actions.tables import agent_operations
from outboxkit.console import ConsoleConfig
from outboxkit.console.security import (
    Principal,
    ProxyIdentity,
    ProxyRefusal,
    TokenFileError,
    Tokens,
)
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from sqlalchemy import select
from sqlalchemy.pool import NullPool
from starlette.routing import Route

from tests.support import workflow_ops as w
from tests.support.actions import leave_unknown, sessions_for
from tests.support.console import (
    OPERATOR_TOKEN,
    TOKENS,
    VIEWER_TOKEN,
    csrf_of,
    serving,
    signed_in,
)


@pytest.fixture
def console_url(pg_url: str, kafka_bootstrap: str) -> Iterator[str]:
    config = ConsoleConfig(
        db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), tokens=TOKENS
    )
    with serving(config) as base:
        yield base


def test_anonymous_requests_go_to_the_login_page_and_changes_are_refused(console_url: str) -> None:
    with httpx.Client(base_url=console_url) as client:
        for path in ("/", "/outbox", "/dlq", "/actions", "/workflows", "/audit", "/inbox"):
            response = client.get(path)
            assert (response.status_code, response.headers["location"]) == (303, "/login")
        assert client.post("/outbox/requeue", data={"scope": "all"}).status_code == 403
        wrong = client.post("/login", data={"csrf": csrf_of(client.get("/login").text),
                                            "token": "not-a-token-at-all"})  # fmt: skip
        assert wrong.status_code == 401 and "unknown token" in wrong.text
        # the login form itself needs its CSRF token
        no_csrf = httpx.post(f"{console_url}/login", data={"token": OPERATOR_TOKEN})
        assert no_csrf.status_code == 403


def test_every_response_carries_the_security_headers(console_url: str) -> None:
    with signed_in(console_url, VIEWER_TOKEN) as client:
        for path in ("/", "/outbox", "/audit", "/static/console.js", "/nosuch"):
            headers = client.get(path).headers
            csp = headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp
            assert "frame-ancestors 'none'" in csp
            assert headers["x-frame-options"] == "DENY"
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["referrer-policy"] == "no-referrer"
        page = client.get("/").text
        assert '<script src="/static/console.js"' in page
        assert "<script>" not in page and " on" + "click=" not in page


def test_the_session_cookie_is_httponly_and_samesite_strict(console_url: str) -> None:
    client = httpx.Client(base_url=console_url)
    page = client.get("/login")
    response = client.post("/login", data={"csrf": csrf_of(page.text), "token": VIEWER_TOKEN})
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert VIEWER_TOKEN not in response.headers["set-cookie"]
    assert VIEWER_TOKEN not in (response.headers.get("location") or "")


def test_every_post_without_the_csrf_token_is_refused(console_url: str, pg_url: str) -> None:
    from outboxkit.console.app import create_app

    app = create_app(
        ConsoleConfig(db_url=pg_url, kafka=KafkaSettings(bootstrap="127.0.0.1:1"), tokens=TOKENS)
    )
    posts = [
        route.path.replace("{topic}", "t.dlq").replace("{tenant}", "acme")
        .replace("{workflow_id}", "w").replace("{decision}", "resume")
        for route in app.routes
        if isinstance(route, Route) and "POST" in (route.methods or ()) and route.path != "/login"
    ]  # fmt: skip
    assert {"/outbox/requeue", "/dlq/t.dlq/replay", "/actions/resolve", "/logout"} <= set(posts)
    with signed_in(console_url, OPERATOR_TOKEN) as client:
        for path in posts:
            for data in ({"reason": "x"}, {"reason": "x", "csrf": "forged"}):
                response = client.post(path, data=data)
                assert response.status_code == 403, path
                assert "CSRF" in response.text
        assert client.get("/audit").text.count("<tr>") == 2  # header and "nothing done"


def test_a_viewer_cannot_act(console_url: str) -> None:
    with signed_in(console_url, VIEWER_TOKEN) as client:
        page = client.get("/outbox?which=parked").text
        assert "vera (viewer)" in page
        response = client.post(
            "/outbox/requeue", data={"csrf": csrf_of(page), "scope": "all", "reason": "x"}
        )
        assert response.status_code == 403 and "viewers cannot act" in response.text


def test_tokens_parse_and_bad_lines_name_the_line_not_the_token() -> None:
    tokens = Tokens.parse(["# comment", "", "abcdefghijklmnopq operator Ann Smith"], "f")
    principal = tokens.find("abcdefghijklmnopq")
    assert principal is not None and (principal.name, principal.role) == ("Ann Smith", "operator")
    assert tokens.find("abcdefghijklmnopr") is None
    for line, message in (
        ("secret-token-value-1 admin bob", "f line 1: expected TOKEN ROLE NAME"),
        ("short viewer bob", "f line 1: a token has 16 characters at least"),
    ):
        with pytest.raises(TokenFileError) as caught:
            Tokens.parse([line], "f")
        assert str(caught.value).startswith(message)
        assert line.split()[0] not in str(caught.value)


PROXY = {"X-Forwarded-User": "pat", "X-Forwarded-Role": "operator"}


def test_a_proxy_header_is_believed_from_a_trusted_address_only(pg_url: str) -> None:
    proxy = ProxyIdentity(
        header="X-Forwarded-User",
        trusted=ProxyIdentity.networks(["127.0.0.1/32"]),
        role_header="X-Forwarded-Role",
    )
    config = ConsoleConfig(
        db_url=pg_url, kafka=KafkaSettings(bootstrap="127.0.0.1:1"), tokens=TOKENS, proxy=proxy
    )
    with serving(config) as base:
        # through the proxy (127.0.0.1): signed in as the user it names, with its role
        with httpx.Client(base_url=base, headers=PROXY) as client:
            page = client.get("/audit")
            assert page.status_code == 200 and "pat (operator)" in page.text
            # a change carries the session's CSRF token as with a token sign-in
            assert client.post("/outbox/requeue", data={"scope": "all"}).status_code == 403
            asked = client.post("/outbox/requeue", data={"csrf": csrf_of(page.text),
                                                         "scope": "all"})  # fmt: skip
            assert asked.status_code == 200 and "would be requeued" in asked.text
            bad = client.get("/audit", headers={"X-Forwarded-Role": "admin"})
            assert bad.status_code == 403
        # the same headers from another address (127.0.0.2, not trusted) are ignored
        transport = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=base, headers=PROXY, transport=transport) as client:
            response = client.get("/audit")
            assert (response.status_code, response.headers["location"]) == (303, "/login")
            assert client.post("/outbox/requeue", data={"scope": "all"}).status_code == 403


def test_proxy_users_and_token_lines_limit_principals_to_tenants() -> None:
    lines = ["# who", "pat operator tenants=acme,initech", "vic viewer"]
    users = ProxyIdentity.parse_users(lines, "u")
    proxy = ProxyIdentity("X-User", ProxyIdentity.networks(["10.0.0.0/8"]), users=users)
    pat = proxy.identify("10.1.2.3", {"X-User": "pat"})
    assert pat == Principal("pat", "operator", frozenset({"acme", "initech"}))
    assert pat.allows("acme") and not pat.allows("globex")
    assert proxy.identify("10.1.2.3", {"X-User": "vic"}) == Principal("vic", "viewer")
    assert proxy.identify("192.168.1.1", {"X-User": "pat"}) is None  # not the proxy: ignored
    assert proxy.identify("10.1.2.3", {}) is None
    with pytest.raises(ProxyRefusal):
        proxy.identify("10.1.2.3", {"X-User": "mallory"})  # not in the users file
    tokens = Tokens.parse(["abcdefghijklmnopq operator Ann Smith tenants=acme"], "f")
    ann = Principal("Ann Smith", "operator", frozenset({"acme"}))
    assert tokens.find("abcdefghijklmnopq") == ann
    with pytest.raises(TokenFileError, match="f line 1: tenants= names one tenant"):
        Tokens.parse(["abcdefghijklmnopq operator ann tenants="], "f")
    with pytest.raises(TokenFileError, match="--trusted-proxy 'nowhere'"):
        ProxyIdentity.networks(["nowhere"])


LIMITED_TOKEN = "limited-token-0123456789"


def test_an_operator_limited_to_a_tenant_cannot_see_or_resolve_another_tenants_action(
    pg_url: str, kafka_bootstrap: str
) -> None:
    async def seed() -> None:
        await leave_unknown(pg_url, "acme", "refund-acme")
        await leave_unknown(pg_url, "globex", "refund-globex")
        async with sessions_for(pg_url) as sessions:
            engine = w.build_engine(sessions)
            await w.start(engine, "PO-acme", tenant="acme")
            await w.start(engine, "PO-globex", tenant="globex")

    asyncio.run(seed())
    tokens = Tokens.parse([f"{LIMITED_TOKEN} operator lena tenants=acme"], "test")
    config = ConsoleConfig(
        db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), tokens=tokens
    )
    with serving(config) as base, signed_in(base, LIMITED_TOKEN) as client:
        assert client.get("/").headers["location"] == "/actions"
        page = client.get("/actions").text
        assert "refund-acme" in page and "refund-globex" not in page
        assert "lena (operator; tenants acme)" in page
        assert client.get("/actions", params={"tenant": "globex"}).status_code == 403
        resolve = {"csrf": csrf_of(page), "resolution": "failed", "reason": "not ours"}
        refused = client.post("/actions/resolve", data={**resolve, "tenant": "globex",
                                                        "key": "refund-globex"})  # fmt: skip
        assert refused.status_code == 403 and "not allowed tenant &#39;globex&#39;" in refused.text
        assert states(pg_url) == {"refund-acme": "UNKNOWN", "refund-globex": "UNKNOWN"}
        done = client.post("/actions/resolve", data={**resolve, "tenant": "acme",
                                                     "key": "refund-acme"})  # fmt: skip
        assert done.status_code == 200, done.text
        assert states(pg_url) == {"refund-acme": "FAILED_FINAL", "refund-globex": "UNKNOWN"}
        workflows = client.get("/workflows").text
        assert "PO-acme" in workflows and "PO-globex" not in workflows
        assert client.get("/workflows/globex/PO-globex").status_code == 403
        assert client.get("/workflows/acme/PO-acme").status_code == 200
        decide = client.post("/workflows/globex/PO-globex/cancel",
                             data={"csrf": resolve["csrf"], "reason": "x"})  # fmt: skip
        assert decide.status_code == 403
        # outbox rows, dead letters, the inbox and the audit trail carry no tenant: closed
        for path in ("/outbox", "/dlq", "/inbox", "/audit", "/overview/live"):
            assert client.get(path).status_code == 403, path


def states(db_url: str) -> dict[str, str]:
    engine = make_engine(db_url, poolclass=NullPool)
    with engine.connect() as connection:
        rows = connection.execute(select(agent_operations.c.op_key, agent_operations.c.state))
        found = {row.op_key: row.state for row in rows}
    engine.dispose()
    return found
