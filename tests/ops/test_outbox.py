"""``outboxkit outbox list/requeue``: rows a real relay parked are listed, requeued, published."""

from __future__ import annotations

import json
from dataclasses import replace

from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay import Relay, RelayOptions
from sqlalchemy import select
from sqlalchemy.orm import Session

from tests.support.kafka import read_topic
from tests.support.ops import cli
from tests.support.waits import scaled

BIG = "x" * 300_000  # above the relay's max_request_size below, below the broker's limit
PARKING = RelayOptions(
    lease_ttl_s=5.0,
    request_timeout_s=2.0,
    poll_interval_s=0.2,
    max_request_size=100_000,
    max_attempts=2,
    row_backoff=Backoff(base_s=0.05, cap_s=0.1),
    retention_s=3600,
)


def write_events(url: str, topic: str, events: list) -> None:
    engine = make_engine(url)
    with Session(engine) as session, session.begin():
        for event in events:
            Outbox(default_topic=topic).add(session, event)
    engine.dispose()


async def test_parked_rows_are_listed_requeued_and_then_published(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    db = ("--db-url", pg_url)
    write_events(
        pg_url,
        topic,
        [
            new_event("order.placed", "/shop", {"n": 1}, id="small-1", partitionkey="a"),
            new_event("order.placed", "/shop", {"blob": BIG}, id="big-1", partitionkey="b"),
            new_event("order.placed", "/shop", {"blob": BIG}, id="big-2", partitionkey="c"),
            new_event("order.placed", "/shop", {"n": 2}, id="small-2", partitionkey="a"),
        ],
    )
    assert (
        await Relay(
            db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=PARKING
        ).drain(timeout_s=scaled(60))
        == 2
    )

    listed = await cli("outbox", "list", "--parked", "--json", *db)
    assert listed.code == 0, listed.err
    document = listed.json()
    assert document["parked"] == 2
    parked = {row["event_id"]: row for row in document["rows"]}
    assert set(parked) == {"big-1", "big-2"}
    for row in parked.values():
        assert row["type"] == "order.placed" and row["source"] == "/shop"
        assert row["topic"] == topic and row["attempts"] == 2
        assert row["parked_ms"] is not None
        assert "MessageSizeTooLarge" in row["last_error"]
        assert "blob" not in json.dumps(row)  # never the payload
    table = await cli("outbox", "list", "--parked", *db)
    assert "2 parked outbox row(s)" in table.out and "big-1" in table.out
    assert (await cli("outbox", "list", "--json", *db)).json()["pending"] == 0

    published_id = _id_of(pg_url, "small-1")
    for bad, reason in (
        (["999999"], "no outbox row with id 999999"),
        ([str(published_id)], f"id {published_id} not parked"),
        ([str(parked["big-1"]["id"]), "999999"], "no outbox row with id 999999"),
        ([], "give the ids of parked rows, or --all-parked"),
        ([str(parked["big-1"]["id"]), "--all-parked"], "not both"),
    ):
        refused = await cli("outbox", "requeue", *bad, *db)
        assert refused.code == 2, (bad, refused.out)
        assert reason in refused.error_line()
    assert (await cli("outbox", "list", "--parked", "--json", *db)).json()["parked"] == 2

    requeued = await cli("outbox", "requeue", str(parked["big-1"]["id"]), *db)
    assert requeued.code == 0, requeued.err
    assert requeued.out.strip() == "requeued 1 row(s)"
    pending = (await cli("outbox", "list", "--json", *db)).json()
    assert [(r["event_id"], r["attempts"], r["parked_ms"]) for r in pending["rows"]] == [
        ("big-1", 0, None)
    ]
    assert (await cli("outbox", "list", "--parked", "--json", *db)).json()["parked"] == 1
    everything = await cli("outbox", "requeue", "--all-parked", *db)
    assert everything.out.strip() == "requeued 1 row(s)"

    # The operator raised the size limit: a relay now publishes both requeued rows.
    fixed = replace(PARKING, max_request_size=1024 * 1024)
    assert (
        await Relay(
            db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=fixed
        ).drain(timeout_s=scaled(60))
        == 2
    )
    records = await read_topic(kafka_bootstrap, topic, expected=4)
    assert sorted(dict(r.headers)["ce_id"] for r in records) == [
        b"big-1",
        b"big-2",
        b"small-1",
        b"small-2",
    ]
    assert (await cli("outbox", "list", "--parked", "--json", *db)).json()["parked"] == 0
    assert (await cli("outbox", "list", "--parked", *db)).out.strip() == "no parked outbox rows"


def _id_of(url: str, event_id: str) -> int:
    engine = make_engine(url)
    with engine.connect() as connection:
        found = connection.scalar(
            select(outbox_events.c.id).where(outbox_events.c.event_id == event_id)
        )
    engine.dispose()
    return int(found)
