"""Relay processes on real PostgreSQL and Kafka: concurrency, crashes, broker restarts."""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.tables import outbox_events, outbox_shard_leases
from outboxkit.testing.kafka import KafkaBroker
from outboxkit.testing.processes import kill, start_cli, terminate
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from tests.support.kafka import read_topic, wait_for

KEYS = 50


def relay_args(db_url: str, bootstrap: str, *extra: str) -> list[str]:
    return [
        "relay",
        "--db-url",
        db_url,
        "--bootstrap",
        bootstrap,
        "--lease-ttl",
        "3",
        "--request-timeout-ms",
        "1500",
        "--poll-interval",
        "0.2",
        "--batch-size",
        "200",
        *extra,
    ]


def write_sequence(url: str, topic: str, start: int, count: int, per_tx: int = 250) -> None:
    """Write events ``start..start+count`` round-robin over KEYS keys, in order."""
    engine = make_engine(url)
    outbox = Outbox(default_topic=topic)
    for tx_start in range(start, start + count, per_tx):
        with Session(engine) as session, session.begin():
            for seq in range(tx_start, min(tx_start + per_tx, start + count)):
                key = f"key-{seq % KEYS}"
                outbox.add(session, new_event("seq", "/test", {"seq": seq}, partitionkey=key))
    engine.dispose()


def published_count(url: str) -> int:
    engine = make_engine(url)
    with engine.connect() as conn:
        count = conn.scalar(
            select(func.count())
            .select_from(outbox_events)
            .where(outbox_events.c.published_ms.is_not(None))
        )
    engine.dispose()
    return count


def lease_holders(url: str) -> set[str]:
    engine = make_engine(url)
    with engine.connect() as conn:
        holders = set(
            conn.scalars(
                select(outbox_shard_leases.c.holder).where(
                    outbox_shard_leases.c.holder.is_not(None)
                )
            )
        )
    engine.dispose()
    return holders


def check_order(records: list, total: int, allow_duplicates: bool) -> int:
    """Assert every seq arrived and, per key, first occurrences are in write order.

    Returns the number of duplicate records.
    """
    seen: set[int] = set()
    firsts: dict[bytes, list[int]] = defaultdict(list)
    for record in records:
        seq = json.loads(record.value)["seq"]
        assert record.key == f"key-{seq % KEYS}".encode()
        if seq not in seen:
            seen.add(seq)
            firsts[record.key].append(seq)
    assert seen == set(range(total)), f"missing: {sorted(set(range(total)) - seen)[:20]}"
    for key, seqs in firsts.items():
        assert seqs == sorted(seqs), f"order broken for {key!r}"
    duplicates = len(records) - len(seen)
    if not allow_duplicates:
        assert duplicates == 0
    return duplicates


def published_by(log_path: Path) -> int:
    match = re.search(r"stopped: (\d+) published", log_path.read_text())
    assert match, log_path.read_text()[-2000:]
    return int(match.group(1))


async def test_two_relays_share_5000_events_in_order_without_duplicates(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    logs = [tmp_path / "relay-a.log", tmp_path / "relay-b.log"]
    relays = [start_cli(relay_args(pg_url, kafka_bootstrap), log) for log in logs]
    try:
        await wait_for(lambda: lease_holders(pg_url), lambda h: len(h) == 2, 60, "two holders")
        write_sequence(pg_url, topic, 0, 5000)
        await wait_for(lambda: published_count(pg_url), lambda n: n == 5000, 120, "5000 published")
    finally:
        codes = [terminate(relay) for relay in relays]
    assert codes == [0, 0]
    assert all(published_by(log) > 0 for log in logs)
    assert sum(published_by(log) for log in logs) == 5000
    records = await read_topic(kafka_bootstrap, topic, expected=5000)
    check_order(records, 5000, allow_duplicates=False)
    assert lease_holders(pg_url) == set()


async def test_a_relay_joining_mid_stream_takes_shards_over_without_duplicates(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    """Shards change hands while events keep coming: the relay giving them away first records
    what it published, so the new holder publishes nothing a second time."""
    logs = [tmp_path / "relay-a.log", tmp_path / "relay-b.log"]
    first = start_cli(relay_args(pg_url, kafka_bootstrap), logs[0])
    relays = [first]
    try:
        await wait_for(lambda: lease_holders(pg_url), lambda h: len(h) == 1, 60, "one holder")
        for start in range(0, 4000, 100):
            write_sequence(pg_url, topic, start, 100, per_tx=20)
            if start == 1000:
                relays.append(start_cli(relay_args(pg_url, kafka_bootstrap), logs[1]))
            await asyncio.sleep(0.05)
        await wait_for(lambda: lease_holders(pg_url), lambda h: len(h) == 2, 60, "two holders")
        await wait_for(lambda: published_count(pg_url), lambda n: n == 4000, 120, "4000 published")
    finally:
        codes = [terminate(relay) for relay in relays]
    assert codes == [0, 0]
    assert all(published_by(log) > 0 for log in logs), "the second relay never took shards"
    records = await read_topic(kafka_bootstrap, topic, expected=4000)
    check_order(records, 4000, allow_duplicates=False)


async def test_relay_killed_mid_stream_and_restarted_loses_nothing(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    write_sequence(pg_url, topic, 0, 5000)
    first = start_cli(relay_args(pg_url, kafka_bootstrap), tmp_path / "first.log")
    try:
        await wait_for(lambda: published_count(pg_url), lambda n: n >= 600, 60, "some published")
    finally:
        kill(first)
    assert published_count(pg_url) < 5000, "the kill came too late to test anything"
    second = start_cli(relay_args(pg_url, kafka_bootstrap), tmp_path / "second.log")
    try:
        await wait_for(lambda: published_count(pg_url), lambda n: n == 5000, 120, "all published")
    finally:
        assert terminate(second) == 0
    records = await read_topic(kafka_bootstrap, topic, expected=5000)
    check_order(records, 5000, allow_duplicates=True)


async def test_broker_restart_under_the_relay_loses_nothing(
    pg_url: str, own_kafka: KafkaBroker, topic: str, tmp_path: Path
) -> None:
    relay = start_cli(relay_args(pg_url, own_kafka.bootstrap), tmp_path / "relay.log")
    try:
        write_sequence(pg_url, topic, 0, 1000)
        await wait_for(lambda: published_count(pg_url), lambda n: n >= 1, 60, "first publish")
        own_kafka.stop()
        write_sequence(pg_url, topic, 1000, 1000)
        log = tmp_path / "relay.log"
        await wait_for(log.read_text, lambda text: "kafka unavailable" in text, 60, "outage seen")
        own_kafka.start()
        await wait_for(lambda: published_count(pg_url), lambda n: n == 2000, 120, "all published")
    finally:
        assert terminate(relay) == 0
    records = await read_topic(own_kafka.bootstrap, topic, expected=2000)
    check_order(records, 2000, allow_duplicates=True)
    assert "kafka available again" in (tmp_path / "relay.log").read_text()


async def test_listen_notify_wakes_the_relay_long_before_the_poll(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    args = relay_args(pg_url, kafka_bootstrap)
    args[args.index("--poll-interval") + 1] = "60"
    relay = start_cli(args, tmp_path / "relay.log")
    try:
        await wait_for(lambda: lease_holders(pg_url), lambda h: len(h) == 1, 60, "relay up")
        # The relay's first heartbeat and the LISTEN connection are up; after this write the
        # only way to publish within 15 s (a quarter of the poll interval) is the NOTIFY.
        await wait_for(lambda: published_count(pg_url), lambda n: n == 0, 5, "idle")
        write_sequence(pg_url, topic, 0, 1)
        await wait_for(lambda: published_count(pg_url), lambda n: n == 1, 15, "woken by NOTIFY")
    finally:
        assert terminate(relay) == 0


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_second_relay_on_sqlite_waits_for_the_first(
    backend: str, sqlite_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    first = start_cli(relay_args(sqlite_url, kafka_bootstrap), tmp_path / "first.log")
    second = None
    try:
        await wait_for(lambda: lease_holders(sqlite_url), lambda h: len(h) == 1, 60, "first up")
        (holder,) = lease_holders(sqlite_url)
        second = start_cli(relay_args(sqlite_url, kafka_bootstrap), tmp_path / "second.log")
        write_sequence(sqlite_url, topic, 0, 500)
        await wait_for(lambda: published_count(sqlite_url), lambda n: n == 500, 60, "published")
        assert lease_holders(sqlite_url) == {holder}
        assert terminate(first) == 0
        await wait_for(
            lambda: lease_holders(sqlite_url), lambda h: h and h != {holder}, 30, "handover"
        )
    finally:
        terminate(first)
        if second is not None:
            assert terminate(second) == 0
    assert published_by(tmp_path / "first.log") == 500
    assert published_by(tmp_path / "second.log") == 0
    check_order(await read_topic(kafka_bootstrap, topic, expected=500), 500, False)


def terminate_backends(url: str, database: str) -> int:
    """Cut every connection to ``database`` but our own, as a failover or restart would."""
    engine = make_engine(url)
    with engine.begin() as conn:
        count = conn.scalar(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = :db AND pid <> pg_backend_pid()"
            ),
            {"db": database},
        )
    engine.dispose()
    return count


async def test_database_connections_cut_under_the_relay_loses_nothing(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    database = make_url(pg_url).database
    write_sequence(pg_url, topic, 0, 3000)
    relay = start_cli(relay_args(pg_url, kafka_bootstrap, "--batch-size", "50"), tmp_path / "r.log")
    cuts = 0
    try:
        for threshold in (300, 1200, 2100):
            await wait_for(lambda: published_count(pg_url), lambda n, t=threshold: n >= t, 60, "")
            cuts += terminate_backends(pg_url, database) > 0
        await wait_for(lambda: published_count(pg_url), lambda n: n == 3000, 120, "all published")
    finally:
        assert terminate(relay) == 0
    assert cuts == 3
    check_order(await read_topic(kafka_bootstrap, topic, expected=3000), 3000, True)
    log = (tmp_path / "r.log").read_text()
    # each loss of the LISTEN connection is followed by word that it is back
    assert log.count("LISTEN connection lost") == log.count("LISTEN restored") > 0, log[-3000:]
