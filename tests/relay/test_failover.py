"""The logical relay across a PostgreSQL failover: a primary and a streaming standby of
PostgreSQL 15 (outboxkit.testing.postgres_pair), the standby promoted, clients reaching the
new primary through the same address. A promotion takes the logical slot (slots are not
copied to a standby before PostgreSQL 17).

- Rows: every event committed before and after the promotion reaches Kafka, for a relay
  running across it and for one started after it (the slot is created again and the rows
  left in the table are published first).
- WAL messages: those after the old slot's position exist only in the old WAL; the gap is
  reported (ERROR with the LSN range and the count, status exit 1, the metric, /readyz 503)
  and kept until acknowledged, for a running relay and for one started after the promotion.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from typing import NamedTuple

import pytest
from outboxkit.migrations.runner import upgrade
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.relay import Relay, catch_up
from outboxkit.relay.slot import Slot, default_slot_name
from outboxkit.testing.postgres_pair import FailoverPair, failover_pair
from prometheus_client import REGISTRY
from sqlalchemy import text
from sqlalchemy.orm import Session

from tests.relay.invariants import assert_nothing_lost, pending_rows, seqs_of
from tests.relay.test_logical_faults import relay_for
from tests.relay.test_processes import KEYS, write_sequence
from tests.support.kafka import read_topic, wait_for
from tests.support.ops import cli

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pair() -> Iterator[FailoverPair]:
    """A primary and a streaming standby of their own (root and pg_createcluster, as tls_pg)."""
    if os.geteuid() != 0 or shutil.which("pg_createcluster") is None:
        pytest.skip("the failover pair needs root and pg_createcluster")
    with failover_pair() as made:
        yield made


@pytest.fixture
def db_url(pair: FailoverPair) -> str:
    """A fresh migrated database on the pair's primary (through the front door), with a
    standby streaming it."""
    if not pair.standbys:
        pair.add_standby()  # the previous test promoted the last one
    name = f"fo_{uuid.uuid4().hex[:10]}"
    engine = make_engine(pair.url())
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text(f"CREATE DATABASE {name}")
        )
    engine.dispose()
    url = pair.url(name)
    upgrade(url)
    return url


class Scene(NamedTuple):
    """What each test here uses: the pair, a database on it, the broker, a topic, the log."""

    pair: FailoverPair
    db_url: str
    bootstrap: str
    topic: str
    caplog: pytest.LogCaptureFixture


@pytest.fixture
def scene(
    pair: FailoverPair,
    db_url: str,
    kafka_bootstrap: str,
    topic: str,
    caplog: pytest.LogCaptureFixture,
) -> Scene:
    caplog.set_level(logging.INFO, "outboxkit.relay")
    return Scene(pair, db_url, kafka_bootstrap, topic, caplog)


def write_messages(url: str, topic: str, start: int, count: int) -> None:
    """Events ``start..start+count`` as outbox WAL messages (``Outbox(wal_messages=True)``)."""
    engine = make_engine(url)
    outbox = Outbox(default_topic=topic, wal_messages=True)
    for tx_start in range(start, start + count, 10):
        with Session(engine) as session, session.begin():
            for seq in range(tx_start, min(tx_start + 10, start + count)):
                key = f"key-{seq % KEYS}"
                outbox.add(session, new_event("seq", "/test", {"seq": seq}, partitionkey=key))
    engine.dispose()


async def on_kafka(bootstrap: str, topic: str, expected: int) -> set[int]:
    return set(seqs_of(await read_topic(bootstrap, topic, expected=expected, timeout=30)))


async def streaming(relay: Relay) -> None:
    """Wait until the relay streams its slot (WAL messages before the slot are in none)."""
    await wait_for(
        lambda: relay.readiness.ready()[1].get("stage", ""),
        lambda stage: stage.startswith("streaming slot"),
        60,
        "the slot streamed",
    )


def gap_lines(text_: str) -> list[str]:
    return [line for line in text_.splitlines() if "WAL-message gap" in line]


async def test_rows_committed_around_a_promotion_all_reach_kafka_relay_running(
    scene: Scene,
) -> None:
    pair, db_url, kafka_bootstrap, topic, caplog = scene
    relay = relay_for(db_url, kafka_bootstrap)
    async with relay:
        write_sequence(db_url, topic, 0, 150, per_tx=10)
        await wait_for(lambda: pending_rows(db_url), lambda n: n == 0, 60, "first rows sent")
        write_sequence(db_url, topic, 150, 100, per_tx=10)  # some still in flight
        pair.wait_replayed()
        pair.promote()
        write_sequence(db_url, topic, 250, 150, per_tx=10)  # on the new primary
        await wait_for(lambda: caplog.text, lambda t: "(timeline " in t, 60, "noticed")
        await wait_for(lambda: pending_rows(db_url), lambda n: n == 0, 60, "the rest sent")
    records = await assert_nothing_lost(db_url, kafka_bootstrap, topic, set(range(400)))
    assert len(set(seqs_of(records))) == 400
    assert gap_lines(caplog.text) == [], "rows only: no WAL-message gap"


async def test_rows_committed_around_a_promotion_all_reach_kafka_relay_restarted(
    scene: Scene,
) -> None:
    pair, db_url, kafka_bootstrap, topic, caplog = scene
    async with relay_for(db_url, kafka_bootstrap):
        write_sequence(db_url, topic, 0, 150, per_tx=10)
        await wait_for(lambda: pending_rows(db_url), lambda n: n == 0, 60, "first rows sent")
    write_sequence(db_url, topic, 150, 100, per_tx=10)  # relay down: in the table and old slot
    pair.wait_replayed()
    pair.promote()
    write_sequence(db_url, topic, 250, 150, per_tx=10)
    async with relay_for(db_url, kafka_bootstrap):
        await wait_for(lambda: pending_rows(db_url), lambda n: n == 0, 60, "the rest sent")
    assert re.search(r"timeline \d+ -> \d+", caplog.text)
    records = await assert_nothing_lost(db_url, kafka_bootstrap, topic, set(range(400)))
    assert len(set(seqs_of(records))) == 400


async def assert_gap_reported(
    relay: Relay, url: str, bootstrap: str, caplog: pytest.LogCaptureFixture, lost: int
) -> int:
    """The gap is in the ERROR line (LSN range, count), /readyz, the metric and status
    (exit 1); return its id."""
    await wait_for(lambda: gap_lines(caplog.text), bool, 60, "the gap reported")
    (record,) = [r for r in caplog.records if "WAL-message gap" in r.getMessage()]
    assert record.levelno == logging.ERROR
    found = re.search(
        r"gap (\d+) from ([0-9A-F]+/[0-9A-F]+) to ([0-9A-F]+/[0-9A-F]+) \(failover "
        r"\(timeline \d+ -> \d+\).*\): (\d+) outbox WAL message event\(s\) lost",
        record.getMessage(),
    )
    assert found is not None, record.getMessage()
    assert int(found.group(4)) == lost
    ready, body = relay.readiness.ready()
    assert not ready
    assert "WAL-message gap" in body["not_ready"]["wal_message_gap"]
    assert REGISTRY.get_sample_value("outboxkit_relay_wal_message_gaps") == 1
    assert REGISTRY.get_sample_value("outboxkit_relay_wal_message_gap_lost_events") == lost
    status = await cli("status", "--db-url", url, "--bootstrap", bootstrap)
    assert status.code == 1
    assert f"from {found.group(2)} to {found.group(3)}" in status.err
    return int(found.group(1))


async def assert_acknowledged(relay: Relay, url: str, bootstrap: str, gap: int) -> None:
    listed = await cli("outbox", "gaps", "--db-url", url)
    assert listed.code == 0 and f"gap {gap} from" in listed.out
    assert (await cli("outbox", "gaps", "--db-url", url, "--ack", str(gap))).code == 0
    assert (await cli("status", "--db-url", url, "--bootstrap", bootstrap)).code == 0
    await wait_for(lambda: relay.readiness.ready()[0], bool, 30, "/readyz ready again")
    assert REGISTRY.get_sample_value("outboxkit_relay_wal_message_gaps") == 0


async def test_wal_messages_lost_in_a_promotion_are_reported_relay_running(
    scene: Scene,
) -> None:
    pair, db_url, kafka_bootstrap, topic, caplog = scene
    relay = relay_for(db_url, kafka_bootstrap)
    async with relay:
        await streaming(relay)
        write_messages(db_url, topic, 0, 100)
        assert await on_kafka(kafka_bootstrap, topic, 100) == set(range(100))
        pair.wait_replayed()
        pair.promote(open_door=False)  # the relay reaches no server meanwhile
        write_messages(pair.primary.url(db_url.rsplit("/", 1)[1]), topic, 100, 60)
        pair.open_door()
        gap = await assert_gap_reported(relay, db_url, kafka_bootstrap, caplog, lost=60)
        write_messages(db_url, topic, 160, 40)  # after the new slot: published
        published = await on_kafka(kafka_bootstrap, topic, 140)
        assert published == set(range(100)) | set(range(160, 200))
        await assert_acknowledged(relay, db_url, kafka_bootstrap, gap)


async def test_wal_messages_lost_in_a_promotion_are_reported_relay_restarted(
    scene: Scene,
) -> None:
    pair, db_url, kafka_bootstrap, topic, caplog = scene
    async with relay_for(db_url, kafka_bootstrap) as first:
        await streaming(first)
        write_messages(db_url, topic, 0, 100)
        assert await on_kafka(kafka_bootstrap, topic, 100) == set(range(100))
    write_messages(db_url, topic, 100, 30)  # relay down: after the old slot's position
    pair.wait_replayed()
    pair.promote()
    write_messages(db_url, topic, 130, 50)  # on the new primary, before the new slot
    relay = relay_for(db_url, kafka_bootstrap)
    async with relay:
        gap = await assert_gap_reported(relay, db_url, kafka_bootstrap, caplog, lost=80)
        write_messages(db_url, topic, 180, 20)
        assert await on_kafka(kafka_bootstrap, topic, 120) == set(range(100)) | set(range(180, 200))
        await assert_acknowledged(relay, db_url, kafka_bootstrap, gap)


async def test_a_slot_recreated_by_a_relay_that_stopped_before_recording_the_gap(
    pg_url: str, kafka_bootstrap: str, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    # No failover here: the slot is dropped while no relay runs, and re-created as a relay
    # does (catch-up intent, then the slot) by one that stops before it records the gap.
    caplog.set_level(logging.INFO, "outboxkit.relay")
    async with relay_for(pg_url, kafka_bootstrap) as first:
        await streaming(first)
        write_messages(pg_url, topic, 0, 20)
        assert await on_kafka(kafka_bootstrap, topic, 20) == set(range(20))
    write_messages(pg_url, topic, 20, 30)  # after the slot's position: lost with it
    engine = make_async_engine(pg_url)
    slot = Slot(engine, default_slot_name(pg_url.rsplit("/", 1)[1]))
    assert await slot.drop()
    await catch_up.intend(engine, slot.name, await catch_up.highest_id(engine))
    await slot.create()
    await engine.dispose()
    relay = relay_for(pg_url, kafka_bootstrap)
    async with relay:
        await wait_for(lambda: gap_lines(caplog.text), bool, 60, "the gap reported")
        assert "re-created by a relay that stopped before recording it)): 30 outbox" in (
            caplog.text
        )
        assert not relay.readiness.ready()[0]
