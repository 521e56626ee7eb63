"""The relay and a consumer on a real three-node Kafka cluster (replication factor 3,
``min.insync.replicas`` 2) while partition leaders change under them: a leader killed with
SIGKILL and restarted, a leader frozen with SIGSTOP and thawed. Events are written all along.
Nothing may be lost, no effect applied twice, each key's first occurrences on Kafka in commit
order, no row parked, and neither the relay nor the consumer restarted."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay.claims import ClaimedRow
from outboxkit.relay.publisher import Publisher
from outboxkit.testing.kafka import create_topic
from outboxkit.testing.kafka_cluster import KafkaCluster
from outboxkit.testing.processes import start_cli, terminate
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tests.chaos.app import EVENT_TYPE, chaos_effects, chaos_metadata
from tests.relay.test_processes import KEYS, check_order
from tests.support.kafka import read_topic, wait_for
from tests.support.waits import scaled

PARTITIONS = 3
STARTED = re.compile(r"\b(relay|consumer) \S+ started\b")


class Writer:
    """Writes ``chaos.step`` events (``key-{seq % KEYS}``, seq counting up) in small
    transactions on a thread of its own until stopped, as an application keeps committing."""

    def __init__(self, db_url: str, topic: str) -> None:
        self.db_url, self.topic = db_url, topic
        self.written = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> int:
        """Stop writing; return how many events were committed."""
        self._stop.set()
        self._thread.join()
        return self.written

    def _run(self) -> None:
        engine = make_engine(self.db_url)
        outbox = Outbox(default_topic=self.topic)
        try:
            while not self._stop.wait(0.05):
                with Session(engine) as session, session.begin():
                    for seq in range(self.written, self.written + 10):
                        key = f"key-{seq % KEYS}"
                        step = {"key": key, "seq": seq}
                        outbox.add(
                            session, new_event(EVENT_TYPE, "/cluster", step, partitionkey=key)
                        )
                self.written += 10
        finally:
            engine.dispose()


def rows_where_set(db_url: str, column: str) -> int:
    """Outbox rows whose ``column`` (``published_ms``, ``parked_ms``) is set."""
    engine = make_engine(db_url)
    with engine.connect() as conn:
        found = conn.scalar(
            select(func.count())
            .select_from(outbox_events)
            .where(outbox_events.c[column].is_not(None))
        )
    engine.dispose()
    return int(found or 0)


def effects(db_url: str) -> list[tuple[str, str, int]]:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(chaos_effects.c.event_id, chaos_effects.c.key, chaos_effects.c.seq).order_by(
                chaos_effects.c.id
            )
        ).all()
    engine.dispose()
    return [(row.event_id, row.key, row.seq) for row in rows]


@pytest.fixture
def cluster_topic(kafka_cluster: KafkaCluster, topic: str) -> Iterator[str]:
    """A topic of three partitions, each with three replicas, all in sync."""
    asyncio.run(create_topic(kafka_cluster.bootstrap, topic, PARTITIONS, 3))
    kafka_cluster.wait_in_sync([topic], scaled(60))
    yield topic
    for node in kafka_cluster.nodes:  # a failed test leaves no node down for the next one
        node.thaw()
        if not node.running:
            node.stop()
            node.start()


async def ride_out(cluster: KafkaCluster, topic: str, log: list[str]) -> None:
    """Kill partition 0's leader and restart it; then freeze partition 1's leader until the
    cluster moves leadership away, and thaw it. Each time, wait until every replica is back in
    sync before the next fault, as an operator would."""
    victim = await asyncio.to_thread(cluster.leader, topic, 0)
    victim.kill()
    log.append(f"killed node {victim.node_id} (leader of {topic}[0])")
    heir = await asyncio.to_thread(cluster.wait_leader_moved, topic, 0, victim, scaled(60))
    log.append(f"{topic}[0] now led by node {heir.node_id}")
    await asyncio.to_thread(victim.start)
    await asyncio.to_thread(cluster.wait_in_sync, [topic], scaled(120))
    frozen = await asyncio.to_thread(cluster.leader, topic, 1)
    frozen.freeze()
    log.append(f"froze node {frozen.node_id} (leader of {topic}[1])")
    try:
        heir = await asyncio.to_thread(cluster.wait_leader_moved, topic, 1, frozen, scaled(60))
        log.append(f"{topic}[1] now led by node {heir.node_id}")
    finally:
        frozen.thaw()
    await asyncio.to_thread(cluster.wait_in_sync, [topic], scaled(120))


@pytest.mark.timeout(scaled(300))
@pytest.mark.parametrize("mode", ["poll", "logical"])
async def test_relay_and_consumer_keep_going_while_leaders_are_killed_and_frozen(
    mode: str, pg_url: str, kafka_cluster: KafkaCluster, cluster_topic: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_url)
    chaos_metadata.create_all(engine)
    engine.dispose()
    bootstrap = kafka_cluster.bootstrap
    relay_log, consumer_log = tmp_path / "relay.log", tmp_path / "consumer.log"
    relay_args = ["relay", "--db-url", pg_url, "--bootstrap", bootstrap, "--mode", mode]
    relay_args += ["--lease-ttl", "3", "--request-timeout-ms", "1500", "--poll-interval", "0.2"]
    relay = start_cli(relay_args, relay_log)
    consumer = start_cli(
        ["consume", "tests.chaos.app:app", "--db-url", pg_url, "--bootstrap", bootstrap],
        consumer_log,
        env={"OUTBOXKIT_CHAOS_TOPIC": cluster_topic},
    )
    faults: list[str] = []
    try:
        with Writer(pg_url, cluster_topic) as writer:
            await wait_for(lambda: len(effects(pg_url)), lambda n: n >= 100, 120, "first effects")
            await ride_out(kafka_cluster, cluster_topic, faults)
            total = writer.stop()
        await wait_for(lambda: len(effects(pg_url)), lambda n: n >= total, 180, "all applied")
        if mode == "poll":
            assert rows_where_set(pg_url, "published_ms") == total
        assert relay.poll() is None and consumer.poll() is None, "a process ended"
    finally:
        relay_code, consumer_code = terminate(relay), terminate(consumer)
    relay_text, consumer_text = relay_log.read_text(), consumer_log.read_text()
    print(f"\n{mode}: {total} events; " + "; ".join(faults))
    print("relay:", [line for line in relay_text.splitlines() if "WARNING" in line][:10])
    assert (relay_code, consumer_code) == (0, 0), relay_text[-2000:] + consumer_text[-2000:]
    assert len(STARTED.findall(relay_text)) == 1 and len(STARTED.findall(consumer_text)) == 1
    assert rows_where_set(pg_url, "parked_ms") == 0
    applied = effects(pg_url)
    assert len(applied) == total == len({event_id for event_id, _, _ in applied}), "applied once"
    by_key: defaultdict[str, list[int]] = defaultdict(list)
    for _, key, seq in applied:
        by_key[key].append(seq)
    assert all(seqs == sorted(seqs) for seqs in by_key.values()), "effects out of key order"
    records = await read_topic(bootstrap, cluster_topic, expected=total, timeout=120)
    duplicates = check_order(records, total, allow_duplicates=True)
    print(f"{mode}: {len(records)} records on Kafka, {duplicates} duplicates")


def sender_tasks() -> list[asyncio.Task[object]]:
    """aiokafka producers' background sender tasks still running in this loop."""
    return [task for task in asyncio.all_tasks() if "_sender_routine" in repr(task.get_coro())]


async def test_a_producer_held_by_a_frozen_leader_is_replaced_and_leaves_nothing_behind(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    # Before: the old producer's stop waited for its batch, was cancelled after the timeout,
    # and left its sender task retrying against the frozen node and its connections open: one
    # more such producer after every outage.
    publisher = Publisher(
        KafkaSettings(bootstrap=kafka_cluster.bootstrap),
        request_timeout_s=1.5,
        linger_s=0.0,
        max_batch_bytes=512 * 1024,
        max_request_size=1024 * 1024,
        client_id="outboxkit-test",
    )

    def rows(first: int, count: int) -> list[ClaimedRow]:
        # One key, so all on one partition: the one whose leader is frozen.
        return [
            ClaimedRow(n, cluster_topic, b"k", [], json.dumps({"seq": n}).encode(), 0)
            for n in range(first, first + count)
        ]

    try:
        first = await publisher.publish(rows(0, 5))
        assert len(first.published) == 5
        assert len(sender_tasks()) == 1
        partition = publisher._partitioner(b"k", [0, 1, 2], [0, 1, 2])
        frozen = await asyncio.to_thread(kafka_cluster.leader, cluster_topic, partition)
        frozen.freeze()
        try:
            held = await publisher.publish(rows(5, 5))
            assert held.outage is not None and held.failed == [] and len(held.released) == 5
            started = time.monotonic()
            raised = await publisher.recreate(held.outage)
            assert time.monotonic() - started < scaled(10)
            assert "recreated" in str(raised)
            assert sender_tasks() == [], "the old producer's sender task is still running"
        finally:
            frozen.thaw()
        await asyncio.to_thread(kafka_cluster.wait_in_sync, [cluster_topic], scaled(120))
        again = await publisher.publish(rows(5, 5))
        assert len(again.published) == 5
    finally:
        await publisher.stop()
    records = await read_topic(kafka_cluster.bootstrap, cluster_topic, expected=10)
    firsts: list[int] = []
    for record in records:
        seq = json.loads(record.value)["seq"]
        if seq not in firsts:
            firsts.append(seq)
    assert firsts == list(range(10))
