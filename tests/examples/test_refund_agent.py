"""The example's payment provider honours Idempotency-Key over real HTTP; the demo runs."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from examples.refund_agent.provider import Fault, PaymentProvider
from tests.support import REPO
from tests.support.kafka import wait_for

BODY = {"charge_id": "ch_1", "amount_cents": 500, "currency": "EUR"}


def call(url: str, method: str, path: str, body=None, headers=None):
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=payload, headers=headers or {})
        response = connection.getresponse()
        names = {name.lower(): value for name, value in response.getheaders()}  # any case
        return response.status, names, json.loads(response.read())
    finally:
        connection.close()


def refund(url: str, key: str, body=BODY, account: str = "acme"):
    return call(url, "POST", "/refunds", body, {"Idempotency-Key": key, "X-Account": account})


def lookup(url: str, key: str, account: str = "acme"):
    return call(url, "GET", f"/refunds?idempotency_key={key}", None, {"X-Account": account})


async def test_provider_replays_refuses_and_scopes_keys_per_account() -> None:
    with PaymentProvider() as provider:
        status, headers, first = refund(provider.url, "k1")
        assert status == 201 and "idempotent-replay" not in headers
        status, headers, replay = refund(provider.url, "k1")
        assert (status, headers.get("idempotent-replay"), replay) == (201, "true", first)
        status, _, _ = refund(provider.url, "k1", {**BODY, "amount_cents": 501})
        assert status == 422
        status, _, other = refund(provider.url, "k1", account="globex")
        assert status == 201 and other["id"] != first["id"]
        status, _, _ = call(provider.url, "POST", "/refunds", BODY, {"X-Account": "acme"})
        assert status == 400  # no Idempotency-Key

        _, _, found = lookup(provider.url, "k1")
        assert found == {"count": 1, "refunds": [first], "in_flight": False}
        assert provider.refund_count() == 2 and provider.replays == 1


async def test_provider_answers_409_while_the_first_request_is_in_flight() -> None:
    with PaymentProvider() as provider:
        hold = provider.inject(Fault.HOLD_BEFORE_COMMIT)
        first = asyncio.create_task(asyncio.to_thread(refund, provider.url, "k1"))
        try:
            await wait_for(hold.reached.is_set, bool, 30, "the first request to be held")
            status, _, _ = await asyncio.to_thread(refund, provider.url, "k1")
            assert status == 409
            _, _, lookup = await asyncio.to_thread(
                call,
                provider.url,
                "GET",
                "/refunds?idempotency_key=k1",
                None,
                {"X-Account": "acme"},
            )
            assert lookup["in_flight"] is True and lookup["count"] == 0
        finally:
            hold.release()
        status, _, _ = await asyncio.wait_for(first, 30)
        assert status == 201 and provider.refund_count() == 1


async def test_the_demo_ends_with_one_refund(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env["OUTBOXKIT_DB_URL"] = f"sqlite:///{tmp_path / 'demo.db'}"
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "examples.refund_agent"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "provider refunds: 1" in result.stdout
    assert "outboxkit.action.reconciled" in result.stdout


async def test_provider_keys_expire_after_24_hours_by_its_clock(db_url: str) -> None:
    now = [time.time()]
    with PaymentProvider(db_url=db_url, clock=lambda: now[0]) as provider:
        _, _, first = refund(provider.url, "k1")
        now[0] += 24 * 3600 - 1
        _, headers, replay = refund(provider.url, "k1")
        assert headers.get("idempotent-replay") == "true" and replay == first
        assert refund(provider.url, "k1", {**BODY, "amount_cents": 7})[0] == 422
        now[0] += 1  # a day after the first request: the key names a new refund
        status, headers, second = refund(provider.url, "k1", {**BODY, "amount_cents": 7})
        assert status == 201 and "idempotent-replay" not in headers
        assert second["id"] != first["id"] and second["amount_cents"] == 7
        assert provider.refund_count("acme") == 2
        assert (provider.replays, provider.conflicts) == (1, 1)
        _, _, found = lookup(provider.url, "k1")
        assert found["count"] == 2 and found["in_flight"] is False
