"""By hand: outbox WAL messages committed without pause across a PostgreSQL promotion, and the
gap the logical relay reports against the events actually missing from Kafka.

A primary and a synchronous standby (every commit reached the standby: nothing is lost with
the old primary, so every missing event is the failover's WAL-message gap); producers commit
WAL-message events (5 per transaction) throughout; halfway the primary is crashed and the
standby promoted; the producers go on on the new primary while the relay reaches no server for
``--held`` seconds, then it does. Prints the events committed, on Kafka, missing, and the gap.
Needs root (``outboxkit.testing.postgres_pair``). ``python -m bench.failover_gap``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid

from aiokafka import AIOKafkaConsumer
from outboxkit.migrations.runner import upgrade
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay, RelayOptions
from outboxkit.relay.failover import Gap, open_gaps
from outboxkit.testing.postgres_pair import FailoverPair, failover_pair
from sqlalchemy import text
from sqlalchemy.orm import Session

from bench.common import kafka

PER_TRANSACTION = 5
FIRST_ON_NEW_PRIMARY = 10**8


class Producers:
    """Threads committing WAL-message events until stopped; seqs never repeat."""

    def __init__(self, url: str, topic: str, count: int, first: int) -> None:
        self.committed: set[int] = set()
        self.failed: set[int] = set()  # their commit's outcome unknown to the producer
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(url, topic, first + number, count))
            for number in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _run(self, url: str, topic: str, seq: int, step: int) -> None:
        engine = make_engine(url)
        outbox = Outbox(default_topic=topic, wal_messages=True)
        while not self._stop.is_set():
            batch = list(range(seq, seq + PER_TRANSACTION * step, step))
            seq += PER_TRANSACTION * step
            try:
                with Session(engine) as session, session.begin():
                    for n in batch:
                        event = new_event("seq", "/bench", {"seq": n}, partitionkey=f"k{n % 16}")
                        outbox.add(session, event)
            except Exception:  # the server went away: counted, not retried
                self.failed.update(batch)
                time.sleep(0.05)
                continue
            self.committed.update(batch)
        engine.dispose()


def database(pair: FailoverPair) -> str:
    name = f"gap_{uuid.uuid4().hex[:8]}"
    engine = make_engine(pair.url())
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text(f"CREATE DATABASE {name}"))
        # Synchronous: a commit the producer saw is on the standby.
        conn.execute(text("ALTER SYSTEM SET synchronous_standby_names = '*'"))
        conn.execute(text("SELECT pg_reload_conf()"))
    engine.dispose()
    upgrade(pair.url(name))
    return name


async def read_seqs(bootstrap: str, topic: str) -> set[int]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    seqs: set[int] = set()
    try:
        while batch := await consumer.getmany(timeout_ms=3000):
            seqs.update(json.loads(r.value)["seq"] for rs in batch.values() for r in rs)
    finally:
        await consumer.stop()
    return seqs


async def run(seconds: float, held: float, producers: int) -> None:
    with kafka() as bootstrap, failover_pair() as pair:
        name = database(pair)
        url, topic = pair.url(name), f"gap-{uuid.uuid4().hex[:8]}"
        options = RelayOptions(mode="logical", lease_ttl_s=6.0, request_timeout_s=3.0)
        relay = Relay(db_url=url, kafka=KafkaSettings(bootstrap=bootstrap), options=options)
        async with relay:
            while not relay.readiness.ready()[1].get("stage", "").startswith("streaming"):
                await asyncio.sleep(0.1)
            old = Producers(url, topic, producers, 0)
            await asyncio.sleep(seconds / 2)
            await asyncio.to_thread(pair.promote, open_door=False)
            old.stop()
            new = Producers(pair.primary.url(name), topic, producers, FIRST_ON_NEW_PRIMARY)
            await asyncio.sleep(held)  # the relay reaches no server meanwhile
            pair.open_door()
            await asyncio.sleep(seconds / 2)
            new.stop()
            gaps: list[Gap] = []
            deadline = time.monotonic() + 60
            while not gaps and time.monotonic() < deadline:
                engine = make_async_engine(url)
                async with engine.connect() as conn:
                    gaps = await open_gaps(conn)
                await engine.dispose()
                await asyncio.sleep(0.5)
            await asyncio.sleep(5)  # the events after the new slot: published
        on_kafka = await read_seqs(bootstrap, topic)
    committed = old.committed | new.committed
    missing = committed - on_kafka
    failed = old.failed | new.failed
    print(
        f"committed {len(committed)} events ({len(old.committed)} on the old primary), "
        f"on Kafka {len(on_kafka)}, missing {len(missing)} "
        f"({len([s for s in missing if s < FIRST_ON_NEW_PRIMARY])} from the old primary)"
    )
    print(
        f"{len(failed)} events' commits failed for the producer "
        f"({len(failed & on_kafka)} of them on Kafka: committed after all)"
    )
    for gap in gaps:
        print(f"reported: {gap.line()} [{gap.count_note}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="Producing, in all.")
    parser.add_argument("--held", type=float, default=3.0, help="Relay without a server.")
    parser.add_argument("--producers", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(run(args.seconds, args.held, args.producers))


if __name__ == "__main__":
    main()
