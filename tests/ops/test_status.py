"""``outboxkit status``: its numbers are what the test set up, and thresholds set the exit code."""

from __future__ import annotations

import os
import socket

from aiokafka import TopicPartition
from outboxkit.consumers.tables import inbox_events
from outboxkit.ops.dlq.tables import dlq_replays
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay.leases import ShardLeases
from outboxkit.testing.kafka import create_topic
from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from tests.support.consumers import produce
from tests.support.ops import cli, commit_offsets

PARTITION_RECORDS = 5


def set_up_outbox(url: str, topic: str, consumer: str) -> None:
    """Four pending rows, the oldest written two minutes ago, and one parked row."""
    engine = make_engine(url)
    with Session(engine) as session, session.begin():
        for n in range(5):
            Outbox(default_topic=topic).add(session, new_event("a", "/s", {"n": n}, id=f"e-{n}"))
    with engine.begin() as connection:
        connection.execute(
            update(outbox_events)
            .where(outbox_events.c.event_id == "e-0")
            .values(created_ms=outbox_events.c.created_ms - 120_000)
        )
        connection.execute(
            update(outbox_events)
            .where(outbox_events.c.event_id == "e-4")
            .values(parked_ms=outbox_events.c.created_ms, attempts=10, last_error="too large")
        )
        connection.execute(
            insert(inbox_events),
            [
                {
                    "consumer": consumer,
                    "source": "/s",
                    "event_id": f"i-{n}",
                    "processed_ms": 1,
                }
                for n in range(3)
            ],
        )
        connection.execute(
            insert(dlq_replays).values(
                dlq_topic=f"{topic}.dlq",
                dlq_partition=0,
                dlq_offset=1,
                target_topic=topic,
                replayed_ms=1,
                replayed_by="tester",
                replay_id="r-1",
            )
        )
    engine.dispose()


async def lease_shards(url: str) -> None:
    """Two relays share the 64 shards as real relays do: 32 each after a rebalancing round."""
    engine = make_async_engine(url)
    host = socket.gethostname()
    first = ShardLeases(engine, "relay-a", host, os.getpid(), ttl_ms=60_000)
    second = ShardLeases(engine, "relay-b", host, os.getpid() + 1, ttl_ms=60_000)
    assert len(await first.heartbeat()) == 64
    assert len(await second.heartbeat()) == 0  # nothing free yet
    assert len(await first.heartbeat()) == 32  # gives back its extra shards
    assert len(await second.heartbeat()) == 32
    await engine.dispose()


async def test_status_reports_what_was_set_up_and_thresholds_set_the_exit_code(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await create_topic(kafka_bootstrap, topic, partitions=2)
    for partition in (0, 1):
        records = [(b"k", b"{}", []) for _ in range(PARTITION_RECORDS)]
        await produce(kafka_bootstrap, topic, records, partition=partition)
    dlq = f"{topic}.dlq"
    await create_topic(kafka_bootstrap, dlq)
    await produce(kafka_bootstrap, dlq, [(None, b"x", []) for _ in range(4)])
    group = f"billing-{topic}"  # also the inbox's consumer name: status finds it there
    await commit_offsets(
        kafka_bootstrap, group, {TopicPartition(topic, 0): 5, TopicPartition(topic, 1): 2}
    )
    set_up_outbox(pg_url, topic, group)
    await lease_shards(pg_url)
    common = ("--db-url", pg_url, "--bootstrap", kafka_bootstrap, "--dlq", dlq)

    result = await cli("status", "--json", *common)
    assert result.code == 0, result.err
    report = result.json()
    assert report["outbox"]["backlog"] == 4
    assert report["outbox"]["parked"] == 1
    assert 120 <= report["outbox"]["oldest_age_s"] < 180
    relays = {r["relay_id"]: r for r in report["relays"]}
    assert set(relays) == {"relay-a", "relay-b"}
    assert relays["relay-a"]["shards"] == list(range(32))
    assert relays["relay-b"]["shards"] == list(range(32, 64))
    assert relays["relay-b"]["pid"] == os.getpid() + 1
    assert all(0 <= r["heartbeat_age_s"] < 60 for r in relays.values())
    assert report["shards"] == {"total": 64, "held": 64, "free": 0}
    assert report["consumers"] == [
        {
            "group": group,
            "total_lag": 3,
            "partitions": [
                {"topic": topic, "partition": 0, "committed": 5, "end": 5, "lag": 0},
                {"topic": topic, "partition": 1, "committed": 2, "end": 5, "lag": 3},
            ],
        }
    ]
    assert report["inbox"] == {"rows": 3, "by_consumer": {group: 3}}
    assert report["dlq"] == [{"topic": dlq, "records": 4, "replayed": 1, "partitions": {"0": 4}}]
    assert report["crossed"] == []

    every_dlq = (
        await cli("status", "--json", "--db-url", pg_url, "--bootstrap", kafka_bootstrap)
    ).json()
    assert {"topic": dlq, "records": 4, "replayed": 1, "partitions": {"0": 4}} in every_dlq["dlq"]

    text = await cli("status", *common)
    assert text.code == 0, text.err
    assert "backlog 4" in text.out and "parked 1" in text.out
    assert "relay-a" in text.out and "0-31" in text.out and "32-63" in text.out

    within = await cli(
        "status", *common, "--max-lag", "3", "--max-parked", "1", "--max-dlq", "4",
        "--max-oldest-age", "600",
    )  # fmt: skip
    assert (within.code, within.err) == (0, "")
    for limit, crossed in (
        (("--max-lag", "2"), f"consumer group {group} lags 3 record(s) (--max-lag 2)"),
        (("--max-parked", "0"), "1 parked outbox row(s) (--max-parked 0)"),
        (("--max-dlq", "3"), f"dead-letter topic {dlq} holds 4 record(s) (--max-dlq 3)"),
        (("--max-oldest-age", "60"), "oldest unpublished outbox row is"),
    ):
        result = await cli("status", "--json", *common, *limit)
        assert result.code == 1, (limit, result.err)
        assert result.err.strip().startswith(f"outboxkit: threshold crossed: {crossed}")
        assert len(result.json()["crossed"]) == 1
    several = await cli("status", *common, "--max-lag", "0", "--max-parked", "0")
    assert several.code == 1 and len(several.err.strip().splitlines()) == 2
