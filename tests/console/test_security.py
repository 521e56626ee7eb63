"""The console's protections over real HTTP on real PostgreSQL and Kafka: sign-in, roles, CSRF,
security headers, and nothing secret in a page or URL."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from outboxkit.console import ConsoleConfig
from outboxkit.console.security import TokenFileError, Tokens
from outboxkit.outbox.kafka_settings import KafkaSettings
from starlette.routing import Route

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
