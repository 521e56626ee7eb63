"""The middleware on a real uvicorn server, called by httpx: effects counted in the database."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from outboxkit.idempotency import IdempotencyStore, Outcome
from outboxkit.idempotency.tables import http_idempotency_keys
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay import Relay, RelayOptions
from outboxkit.testing.kafka import create_topic
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import async_sessionmaker

from tests.support.http import serving
from tests.support.idempotent_app import Controls, build_app, count_payments, create_tables
from tests.support.kafka import read_topic, wait_for
from tests.support.waits import scaled

BODY = {"amount_cents": 500}
FAST = RelayOptions(lease_ttl_s=5.0, request_timeout_s=2.0, poll_interval_s=0.2)


def headers(key: str | None, tenant: str = "acme") -> dict[str, str]:
    found = {"X-Tenant": tenant}
    if key is not None:
        found["Idempotency-Key"] = key
    return found


@asynccontextmanager
async def service(db_url: str, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The test service on uvicorn, and an httpx client of it."""
    create_tables(db_url)
    engine = make_async_engine(db_url)
    try:
        async with (
            serving(build_app(engine, **options)) as base_url,
            httpx.AsyncClient(base_url=base_url, timeout=scaled(60)) as client,
        ):
            yield client
    finally:
        await engine.dispose()


def count(db_url: str, table: Any) -> int:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        found = int(conn.scalar(select(func.count()).select_from(table)) or 0)
    engine.dispose()
    return found


async def test_twenty_identical_requests_at_once_make_one_effect_and_one_event(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await create_topic(kafka_bootstrap, topic)
    controls = Controls()
    async with service(db_url, topic=topic, controls=controls) as client:

        async def post() -> httpx.Response:
            return await client.post("/payments", json=BODY, headers=headers("k-twenty"))

        responses = await asyncio.gather(*(post() for _ in range(20)))
        executed = [r for r in responses if "idempotent-replay" not in r.headers and r.is_success]
        assert len(executed) == 1 and executed[0].status_code == 201
        first = executed[0]
        for response in responses:
            if response is not first:  # in progress when it came, or a replay after
                assert response.status_code == 409 or response.content == first.content
        again = await post()
        assert (again.status_code, again.content) == (201, first.content)

    assert controls.calls == 1
    assert count_payments(db_url) == 1
    assert count(db_url, outbox_events) == 1
    kafka = KafkaSettings(bootstrap=kafka_bootstrap)
    async with Relay(db_url=db_url, kafka=kafka, options=FAST) as relay:
        await relay.drain(timeout_s=scaled(60))
    records = await read_topic(kafka_bootstrap, topic, expected=1, timeout=20)
    assert len(records) == 1
    assert json.loads(records[0].value)["id"] == first.json()["id"]


async def test_a_key_in_progress_is_409_with_retry_after(pg_url: str) -> None:
    gate = asyncio.Event()
    controls = Controls(gate=gate)
    outcomes: list[Outcome] = []
    async with service(pg_url, controls=controls, outcomes=outcomes) as client:
        first = asyncio.create_task(client.post("/payments", json=BODY, headers=headers("k1")))
        await asyncio.wait_for(controls.reached.wait(), scaled(30))
        busy = await client.post("/payments", json=BODY, headers=headers("k1"))
        assert (busy.status_code, busy.headers["retry-after"]) == (409, "1")
        other = await client.post("/payments", json={"amount_cents": 1}, headers=headers("k1"))
        assert other.status_code == 422  # a different request is refused even while in progress
        gate.set()
        assert (await first).status_code == 201
    assert controls.calls == 1 and count_payments(pg_url) == 1
    assert outcomes == [Outcome.IN_PROGRESS, Outcome.CONFLICT, Outcome.EXECUTED]


async def test_a_completed_key_replays_the_same_bytes(sqlite_url: str) -> None:
    outcomes: list[Outcome] = []
    async with service(sqlite_url, outcomes=outcomes) as client:
        first = await client.post("/payments", json=BODY, headers=headers("k1"))
        assert first.status_code == 201 and "idempotent-replay" not in first.headers
        # the IETF draft's Structured Fields string form names the same key
        replay = await client.post("/payments", json=BODY, headers=headers('"k1"'))
        assert replay.status_code == 201
        assert replay.content == first.content  # the resource id and the receipt included
        assert replay.headers["idempotent-replay"] == "true"
        assert replay.headers["content-type"] == first.headers["content-type"]
    assert count_payments(sqlite_url) == 1
    assert outcomes == [Outcome.EXECUTED, Outcome.REPLAYED]


async def test_missing_or_invalid_keys_are_400_and_other_routes_need_none(sqlite_url: str) -> None:
    async with service(sqlite_url) as client:
        missing = await client.post("/payments", json=BODY, headers=headers(None))
        assert missing.status_code == 400
        assert missing.headers["content-type"] == "application/problem+json"
        assert (
            await client.post("/payments", json=BODY, headers=headers('"open'))
        ).status_code == 400
        assert (
            await client.post("/payments", json=BODY, headers=headers("x" * 256))
        ).status_code == 400
        no_tenant = await client.post("/payments", json=BODY, headers={"Idempotency-Key": "k"})
        assert no_tenant.status_code == 400
        assert (await client.post("/free", headers=headers(None))).status_code == 200
        assert (await client.get("/health")).status_code == 200
    assert count_payments(sqlite_url) == 0
    assert count(sqlite_url, http_idempotency_keys) == 0


async def test_the_same_key_with_another_request_is_422_naming_what_differs(
    sqlite_url: str,
) -> None:
    async with service(sqlite_url, fingerprint_headers=["Content-Type"]) as client:
        assert (await client.post("/payments", json=BODY, headers=headers("k1"))).status_code == 201
        other_body = await client.post(
            "/payments", json={"amount_cents": 501}, headers=headers("k1")
        )
        assert other_body.status_code == 422
        assert other_body.json()["differs"] == ["body"]
        other_path = await client.post("/notes", json=BODY, headers=headers("k1"))
        assert (other_path.status_code, other_path.json()["differs"]) == (422, ["path"])
        other_type = await client.post(
            "/payments",
            content=json.dumps(BODY).encode(),
            headers={**headers("k1"), "Content-Type": "text/plain"},
        )
        assert (other_type.status_code, other_type.json()["differs"]) == (422, ["body", "headers"])
        assert "501" not in other_body.text  # nothing of the request is echoed
    assert count_payments(sqlite_url) == 1


async def test_keys_are_scoped_per_tenant(db_url: str) -> None:
    async with service(db_url) as client:
        acme = await client.post("/payments", json=BODY, headers=headers("shared", "acme"))
        globex = await client.post("/payments", json=BODY, headers=headers("shared", "globex"))
        assert acme.status_code == globex.status_code == 201
        assert "idempotent-replay" not in globex.headers
        assert globex.json()["tenant"] == "globex" and acme.json()["tenant"] == "acme"
        again = await client.post("/payments", json=BODY, headers=headers("shared", "globex"))
        assert again.content == globex.content
    assert count_payments(db_url) == 2


async def test_an_expired_key_is_a_new_operation(db_url: str) -> None:
    now = [time.time()]
    async with service(db_url, clock=lambda: now[0]) as client:
        first = await client.post("/payments", json=BODY, headers=headers("k1"))
        now[0] += 24 * 3600 - 1
        before = await client.post("/payments", json=BODY, headers=headers("k1"))
        assert before.content == first.content and count_payments(db_url) == 1
        now[0] += 1  # 24 h after the first request: expired, whatever comes now is new
        after = await client.post("/payments", json={"amount_cents": 7}, headers=headers("k1"))
        assert after.status_code == 201 and "idempotent-replay" not in after.headers
        assert after.json()["id"] != first.json()["id"]
    assert count_payments(db_url) == 2
    assert count(db_url, http_idempotency_keys) == 1  # the record was replaced in place


async def test_a_5xx_rolls_back_and_is_not_stored_so_the_retry_executes(db_url: str) -> None:
    controls = Controls(statuses=[503], raises=0)
    outcomes: list[Outcome] = []
    async with service(db_url, controls=controls, outcomes=outcomes) as client:
        failed = await client.post("/payments", json=BODY, headers=headers("k1"))
        assert failed.status_code == 503
        assert count_payments(db_url) == 0 and count(db_url, outbox_events) == 0
        controls.raises = 1
        crashed = await client.post("/payments", json=BODY, headers=headers("k1"))
        assert crashed.status_code == 500
        assert count_payments(db_url) == 0 and count(db_url, outbox_events) == 0
        retried = await client.post("/payments", json=BODY, headers=headers("k1"))
        assert retried.status_code == 201 and "idempotent-replay" not in retried.headers
        replay = await client.post("/payments", json=BODY, headers=headers("k1"))
        assert replay.content == retried.content
    assert controls.calls == 3
    assert count_payments(db_url) == 1 and count(db_url, outbox_events) == 1
    assert outcomes == [Outcome.RELEASED] * 2 + [Outcome.EXECUTED, Outcome.REPLAYED]


async def test_a_4xx_answer_is_stored_and_replayed(sqlite_url: str) -> None:
    controls = Controls(statuses=[402])
    async with service(sqlite_url, controls=controls) as client:
        refused = await client.post("/payments", json=BODY, headers=headers("k1"))
        again = await client.post("/payments", json=BODY, headers=headers("k1"))
        assert (refused.status_code, again.status_code) == (402, 402)
        assert again.headers["idempotent-replay"] == "true"
    # the handler's writes commit with the stored answer, like any answer that is stored
    assert controls.calls == 1 and count_payments(sqlite_url) == 1


async def test_a_request_that_outlives_its_lease_is_rolled_back_when_another_took_over(
    pg_url: str,
) -> None:
    db_url = pg_url  # on SQLite the slow request's write lock would hold the other back
    gate = asyncio.Event()
    controls = Controls(gate=gate)
    async with service(db_url, controls=controls, lease_s=0.5) as client:
        slow = asyncio.create_task(client.post("/payments", json=BODY, headers=headers("k1")))
        await asyncio.wait_for(controls.reached.wait(), scaled(30))
        engine = make_async_engine(db_url)
        sessions = async_sessionmaker(engine)

        async def lease_over() -> bool:
            async with sessions() as session:
                record = await IdempotencyStore().lookup(session, "acme", "k1")
            return record is not None and not record.in_flight

        await wait_for(lease_over, bool, 30, "the slow request's lease to end")
        await engine.dispose()
        controls.gate = None  # the request that takes over runs straight through
        second = await client.post("/payments", json=BODY, headers=headers("k1"))
        assert second.status_code == 201
        gate.set()
        first = await slow
        assert first.status_code == 409  # its claim was taken over: its work rolled back
        replay = await client.post("/payments", json=BODY, headers=headers("k1"))
        assert replay.content == second.content
    assert controls.calls == 2
    assert count_payments(db_url) == 1 and count(db_url, outbox_events) == 1


async def test_without_the_session_the_response_is_stored_after_the_handler(
    sqlite_url: str,
) -> None:
    controls = Controls(statuses=[500])
    async with service(sqlite_url, controls=controls) as client:
        failed = await client.post("/notes", json=BODY, headers=headers("n1"))
        assert failed.status_code == 500
        first = await client.post("/notes", json=BODY, headers=headers("n1"))
        again = await client.post("/notes", json=BODY, headers=headers("n1"))
        assert first.status_code == 201 and again.content == first.content
    # the handler committed on its own: the failed run's row stays (docs: use the session)
    assert count_payments(sqlite_url, kind="note") == 2
