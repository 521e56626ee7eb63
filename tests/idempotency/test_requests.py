"""Reading keys, fingerprinting requests and matching routes (no server, no database)."""

from __future__ import annotations

import pytest
from outboxkit.idempotency.fingerprint import fingerprint
from outboxkit.idempotency.keys import InvalidKeyError, parse_key
from outboxkit.idempotency.routes import route_matcher
from outboxkit.idempotency.store import stored_scope


def test_keys_bare_or_as_structured_field_strings() -> None:
    assert parse_key("8e03978e-40d5") == parse_key('"8e03978e-40d5"') == "8e03978e-40d5"
    assert parse_key(r'"a \"quoted\" \\ key"') == 'a "quoted" \\ key'
    for bad in ["", '""', '"open', '"a"b', r'"bad \x"', "two words", "x" * 256, "é"]:
        with pytest.raises(InvalidKeyError):
            parse_key(bad)
    assert parse_key("x" * 255) == "x" * 255


def test_the_fingerprint_names_the_part_that_differs() -> None:
    base = fingerprint(
        "POST", "/pay", b"a=1", b"{}", [(b"content-type", b"json")], ["Content-Type"]
    )
    same = fingerprint(
        "post", "/pay", b"a=1", b"{}", [(b"Content-Type", b"json")], ["content-type"]
    )
    assert same.digest == base.digest
    key_differs = fingerprint(
        "POST",
        "/pay",
        b"a=1",
        b"{}",
        [(b"content-type", b"json"), (b"idempotency-key", b"other")],
        ["Content-Type", "Idempotency-Key"],
    )
    assert key_differs.digest == base.digest  # the key itself is never part of it
    query = fingerprint(
        "POST", "/pay", b"a=2", b"{}", [(b"content-type", b"json")], ["content-type"]
    )
    assert query.differing(base.to_json()) == ["path"]
    other = fingerprint("PUT", "/pay", b"a=1", b"[]", [(b"content-type", b"xml")], ["content-type"])
    assert other.differing(base.to_json()) == ["method", "body", "headers"]
    assert "json" not in base.to_json()  # parts are hashes, never the values


def test_routes_by_template_prefix_or_predicate() -> None:
    matches = route_matcher(["POST /refunds", "post /orders/{id}/pay", "PUT /files/*"])
    assert matches("POST", "/refunds") and not matches("GET", "/refunds")
    assert matches("POST", "/orders/42/pay") and not matches("POST", "/orders/42/7/pay")
    assert matches("PUT", "/files") and matches("PUT", "/files/a/b")
    assert not matches("PUT", "/filesystem")
    assert route_matcher(lambda method, path: path == "/x")("GET", "/x")
    assert not route_matcher(None)("POST", "/refunds")
    with pytest.raises(ValueError):
        route_matcher(["/refunds"])


def test_long_scopes_are_stored_as_a_hash() -> None:
    assert stored_scope("acme") == "acme"
    long = stored_scope("p" * 300)
    assert long.startswith("sha256:") and len(long) <= 128 and long != stored_scope("q" * 300)
