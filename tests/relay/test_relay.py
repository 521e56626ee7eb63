"""The relay in-process against real Kafka, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

from cloudevents.core.bindings.kafka import KafkaMessage, from_binary
from cloudevents.core.formats.json import JSONFormat
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay import Relay, RelayOptions
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tests.support.kafka import read_topic

FAST = RelayOptions(
    lease_ttl_s=5.0,
    kafka_request_timeout_ms=2000,
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

    published = await Relay(db_url, kafka_bootstrap, FAST).drain(timeout=60)

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
    assert await Relay(sqlite_url, kafka_bootstrap, FAST).drain(timeout=60) == 1
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
    options = RelayOptions(lease_ttl_s=5.0, kafka_request_timeout_ms=2000, retention_s=0)
    assert await Relay(pg_url, kafka_bootstrap, options).drain(timeout=60) == 20
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
        kafka_request_timeout_ms=2000,
        max_request_size=100_000,
        max_attempts=3,
        retention_s=3600,
    )
    options = RelayOptions(
        **{**options.__dict__, "row_backoff": type(options.row_backoff)(base_s=0.05, cap_s=0.1)}
    )

    await Relay(db_url, kafka_bootstrap, options).drain(timeout=60)

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
    relay = Relay(sqlite_url, kafka_bootstrap, FAST)
    assert await relay.drain(timeout=60) == 25
    engine = relay.engine
    assert await delete_published(engine, retention_ms=3_600_000, chunk=10) == 0
    assert table_counts(sqlite_url)["total"] == 25
    assert await delete_published(engine, retention_ms=-1000, chunk=10) == 25
    await engine.dispose()
    assert table_counts(sqlite_url)["total"] == 0
