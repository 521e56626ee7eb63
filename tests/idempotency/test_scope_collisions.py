"""Stored scopes cannot collide: a literal scope never takes the form a hashed one has."""

from __future__ import annotations

import hashlib

import httpx
from hypothesis import given
from hypothesis import strategies as st
from outboxkit.idempotency.store import MAX_SCOPE_LENGTH, stored_scope

from tests.idempotency.test_http import headers, service
from tests.support.idempotent_app import count_payments

LONG_TENANT = "tenant-" + "x" * 200


def hashed_form(scope: str) -> str:
    """What the store wrote for a long scope before and after the fix."""
    return "sha256:" + hashlib.sha256(scope.encode()).hexdigest()[:120]


scopes = st.one_of(
    st.text(min_size=1, max_size=300),
    st.text(min_size=1, max_size=300).map(lambda s: hashed_form(s)),
    st.text(min_size=0, max_size=130).map(lambda s: "sha256:" + s),
)


@given(scopes, scopes)
def test_distinct_scopes_are_stored_distinctly(a: str, b: str) -> None:
    if a != b:
        assert stored_scope(a) != stored_scope(b)
    assert len(stored_scope(a)) <= MAX_SCOPE_LENGTH


@given(st.text(min_size=MAX_SCOPE_LENGTH + 1, max_size=400))
def test_no_scope_is_stored_as_a_long_scopes_hash(long: str) -> None:
    assert stored_scope(hashed_form(long)) != stored_scope(long)


def test_the_literal_hash_of_a_long_scope_is_another_scope() -> None:
    assert stored_scope("acme") == "acme"
    assert stored_scope(hashed_form(LONG_TENANT)) != stored_scope(LONG_TENANT)


async def test_a_scope_spelled_as_another_tenants_hash_gets_no_replay(sqlite_url: str) -> None:
    # Before the fix the second tenant received the first one's stored 201 (Idempotent-Replay).
    body = {"amount_cents": 700}
    async with service(sqlite_url) as client:
        first = await client.post("/payments", json=body, headers=headers("k", LONG_TENANT))
        assert first.status_code == 201
        forged = hashed_form(LONG_TENANT)
        second: httpx.Response = await client.post(
            "/payments", json=body, headers=headers("k", forged)
        )
        assert second.status_code == 201
        assert "idempotent-replay" not in second.headers
        assert second.json()["tenant"] == forged and second.content != first.content
    assert count_payments(sqlite_url) == 2
