"""The relay in-process against real Kafka, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from cloudevents.core.bindings.kafka import KafkaMessage, from_binary
from cloudevents.core.formats.json import JSONFormat
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.tables import outbox_events, outbox_relays, outbox_shard_leases
from outboxkit.relay import Relay, RelayOptions
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tests.support.kafka import read_topic, wait_for
from tests.support.waits import scaled

FAST = RelayOptions(
    lease_ttl_s=5.0,
    request_timeout_s=2.0,
    poll_interval_s=0.2,
    retention_s=3600,
)


def write_events(url: str, topic: str, events: list, rollback_after: bool = False) -> None:
    engine = make_engine(url)
    outbox = Outbox(default_topic=topic)
    with Session(engine) as session, session.begin():
        for event in events:
            outbox.add(session, event)
        if rollback_after:
            session.rollback()
    engine.dispose()


def table_counts(url: str) -> dict[str, int]:
    engine = make_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                func.count().filter(outbox_events.c.published_ms.is_not(None)),
                func.count().filter(outbox_events.c.parked_ms.is_not(None)),
                func.count(),
            )
        ).one()
    engine.dispose()
    return {"published": rows[0], "parked": rows[1], "total": rows[2]}


async def test_committed_event_arrives_once_and_decodes_to_the_same_event(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    rolled_back = new_event("order.cancelled", "/shop", {"order": 7}, partitionkey="o-7")
    write_events(db_url, topic, [rolled_back], rollback_after=True)
    original = new_event(
        "order.placed",
        "/shop",
        {"order": 7, "total": "12.50", "items": ["a", "b"]},
        subject="orders/7",
        partitionkey="o-7",
        extensions={"tenant": "acme", "priority": 3, "urgent": True},
    )
    write_events(db_url, topic, [original])

    published = await Relay(
        db_url=db_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=FAST
    ).drain(timeout_s=scaled(60))

    assert published == 1
    records = await read_topic(kafka_bootstrap, topic, expected=1)
    assert len(records) == 1
    record = records[0]
    assert record.key == b"o-7"
    headers = dict(record.headers)
    assert headers["content-type"] == b"application/json"
    assert headers["ce_urgent"] == b"true"
    decoded = from_binary(
        KafkaMessage(headers=headers, key=record.key, value=record.value), JSONFormat()
    )
    assert decoded.get_id() == original.get_id()
    assert decoded.get_type() == "order.placed"
    assert decoded.get_source() == "/shop"
    assert decoded.get_subject() == "orders/7"
    assert decoded.get_time() == original.get_time()
    assert decoded.get_data() == {"order": 7, "total": "12.50", "items": ["a", "b"]}
    assert decoded.get_extension("partitionkey") == "o-7"
    assert decoded.get_extension("tenant") == "acme"
    assert decoded.get_extension("priority") == "3"
    assert table_counts(db_url) == {"published": 1, "parked": 0, "total": 1}


async def test_an_event_without_data_is_published_as_a_null_value_without_content_type(
    sqlite_url: str, kafka_bootstrap: str, topic: str
) -> None:
    """CloudEvents Kafka binding 3.2.2: no data is a record with no value."""
    write_events(sqlite_url, topic, [new_event("order.noted", "/shop", partitionkey="o-1")])
    kafka = KafkaSettings(bootstrap=kafka_bootstrap)
    relay = Relay(db_url=sqlite_url, kafka=kafka, options=FAST)
    assert await relay.drain(timeout_s=scaled(60)) == 1
    (record,) = await read_topic(kafka_bootstrap, topic, expected=1)
    assert record.value is None
    assert record.key == b"o-1"
    headers = dict(record.headers)
    assert "content-type" not in headers
    assert headers["ce_partitionkey"] == b"o-1"


async def test_retention_zero_deletes_rows_once_published(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    write_events(pg_url, topic, [new_event("a", "/s", {"n": n}) for n in range(20)])
    options = RelayOptions(lease_ttl_s=5.0, request_timeout_s=2.0, retention_s=0)
    assert (
        await Relay(
            db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=options
        ).drain(timeout_s=scaled(60))
        == 20
    )
    assert len(await read_topic(kafka_bootstrap, topic, expected=20)) == 20
    assert table_counts(pg_url)["total"] == 0


async def test_poison_row_is_parked_with_its_error_while_others_go_through(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    big = "x" * 300_000
    events = [new_event("a", "/s", {"n": n}, partitionkey=f"k{n % 3}") for n in range(30)]
    events.insert(10, new_event("a", "/s", {"blob": big}, partitionkey="poison"))
    write_events(db_url, topic, events)
    options = RelayOptions(
        lease_ttl_s=5.0,
        request_timeout_s=2.0,
        max_request_size=100_000,
        max_attempts=3,
        retention_s=3600,
    )
    options = RelayOptions(
        **{**options.__dict__, "row_backoff": type(options.row_backoff)(base_s=0.05, cap_s=0.1)}
    )

    await Relay(
        db_url=db_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=options
    ).drain(timeout_s=scaled(60))

    records = await read_topic(kafka_bootstrap, topic, expected=30)
    assert sorted(json.loads(r.value)["n"] for r in records) == list(range(30))
    assert table_counts(db_url) == {"published": 30, "parked": 1, "total": 31}
    engine = make_engine(db_url)
    with engine.connect() as conn:
        parked = conn.execute(
            select(outbox_events).where(outbox_events.c.parked_ms.is_not(None))
        ).one()
    engine.dispose()
    assert parked.kafka_key == b"poison"
    assert parked.attempts == 3
    assert "MessageSizeTooLarge" in parked.last_error


async def test_published_rows_are_kept_then_deleted_in_chunks(
    sqlite_url: str, kafka_bootstrap: str, topic: str
) -> None:
    from outboxkit.relay.retention import delete_published

    write_events(sqlite_url, topic, [new_event("a", "/s", {"n": n}) for n in range(25)])
    relay = Relay(db_url=sqlite_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=FAST)
    assert await relay.drain(timeout_s=scaled(60)) == 25
    engine = relay.engine
    assert await delete_published(engine, retention_ms=3_600_000, chunk=10) == 0
    assert table_counts(sqlite_url)["total"] == 25
    assert await delete_published(engine, retention_ms=-1000, chunk=10) == 25
    await engine.dispose()
    assert table_counts(sqlite_url)["total"] == 0


def lease_rows(url: str, relay_id: str) -> tuple[int, int]:
    """Shards leased to ``relay_id`` and its heartbeat rows."""
    engine = make_engine(url)
    with engine.connect() as conn:
        leased = conn.scalar(
            select(func.count())
            .select_from(outbox_shard_leases)
            .where(outbox_shard_leases.c.holder == relay_id)
        )
        alive = conn.scalar(
            select(func.count())
            .select_from(outbox_relays)
            .where(outbox_relays.c.relay_id == relay_id)
        )
    engine.dispose()
    return leased or 0, alive or 0


async def test_stop_mid_stream_settles_what_was_sent_so_a_successor_sends_no_duplicate(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    write_events(pg_url, topic, [new_event("a", "/s", {"n": n}) for n in range(600)])
    engine = make_async_engine(pg_url)
    options = replace(FAST, batch_size=10)
    try:
        async with Relay(
            engine=engine, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=options
        ) as first:
            assert first.running
            await wait_for(lambda: first.stats.published, lambda n: n >= 10, 30, "a first batch")
        assert not first.running
        assert first.stats.published < 600, "the boundary under test: stopped mid-stream"
        # Stopped wherever it was: everything it sent is recorded, its shards are free at once.
        assert table_counts(pg_url)["published"] == first.stats.published
        assert lease_rows(pg_url, first.relay_id) == (0, 0)
        await first.stop()  # idempotent
        async with engine.connect() as conn:  # the caller's engine was left open
            assert await conn.scalar(select(func.count()).select_from(outbox_events)) == 600
    finally:
        await engine.dispose()

    second = Relay(db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=options)
    assert await second.drain(timeout_s=scaled(60)) == 600 - first.stats.published
    records = await read_topic(kafka_bootstrap, topic, expected=600)
    assert sorted(json.loads(r.value)["n"] for r in records) == list(range(600))


async def test_run_works_until_stop_and_drain_finishes_a_running_relay(
    sqlite_url: str, kafka_bootstrap: str, topic: str
) -> None:
    relay = Relay(db_url=sqlite_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=FAST)
    running = asyncio.create_task(relay.run())
    write_events(sqlite_url, topic, [new_event("a", "/s", {"n": n}) for n in range(5)])
    await wait_for(lambda: relay.stats.published, lambda n: n == 5, 30, "5 published")
    assert not running.done(), "run() returns only once stop() is called"
    await relay.stop()
    await asyncio.wait_for(running, scaled(30))
    assert lease_rows(sqlite_url, relay.relay_id) == (0, 0)

    write_events(sqlite_url, topic, [new_event("a", "/s", {"n": n}) for n in range(5, 12)])
    async with relay:  # a stopped relay starts again
        with pytest.raises(RuntimeError, match="already running"):
            await relay.start()
        assert await relay.drain(timeout_s=scaled(60)) == 7
        assert not relay.running
    assert relay.stats.published == 12
    records = await read_topic(kafka_bootstrap, topic, expected=12)
    assert sorted(json.loads(r.value)["n"] for r in records) == list(range(12))


def test_a_relay_takes_exactly_one_of_engine_or_db_url() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Relay(kafka=KafkaSettings(bootstrap="127.0.0.1:1"))
    with pytest.raises(ValueError, match="exactly one"):
        Relay(
            engine=make_async_engine("sqlite:///unused.db"),
            db_url="sqlite:///unused.db",
            kafka=KafkaSettings(bootstrap="127.0.0.1:1"),
        )
    with pytest.raises(ValueError, match="twice the Kafka request timeout"):
        RelayOptions(lease_ttl_s=5.0, request_timeout_s=3.0)


def test_listen_connection_reads_tls_from_the_url_the_way_asyncpg_does() -> None:
    from outboxkit.outbox.notify import listen_dsn

    # The relay's own engine adds ssl=disable for loopback (asyncpg dialect spelling); asyncpg's
    # DSN spells it sslmode, and would send "ssl" to the server as a setting, which fails.
    engine_url = make_async_engine("postgresql://u:p@127.0.0.1:5432/db").url
    assert listen_dsn(engine_url) == "postgresql://u:p@127.0.0.1:5432/db?sslmode=disable"
    assert listen_dsn("postgresql+psycopg://u:p@db.example/x?sslmode=require") == (
        "postgresql://u:p@db.example/x?sslmode=require"
    )
