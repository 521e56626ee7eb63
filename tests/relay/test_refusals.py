"""What the relay does with what it cannot publish: a batch the broker refuses as too large, a
row too large on its own, and a database that was never migrated. Real Kafka, real databases."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from outboxkit.outbox import new_event
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.errors import OutboxError
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay import NotMigratedError, Relay, RelayOptions
from outboxkit.testing.postgres import throwaway_database
from sqlalchemy import select

from tests.relay.test_relay import table_counts, write_events
from tests.support.kafka import read_topic
from tests.support.ops import cli_process
from tests.support.waits import scaled

# max_attempts=1: one failed attempt parks a row, so a wrongly counted attempt shows as a park.
STRICT = RelayOptions(
    lease_ttl_s=5.0,
    request_timeout_s=2.0,
    poll_interval_s=0.2,
    retention_s=3600,
    max_attempts=1,
    row_backoff=Backoff(base_s=0.05, cap_s=0.1),
)
MISSING = "table outbox_events is missing: run 'outboxkit migrate' first"


async def create_small_topic(bootstrap: str, topic: str, max_message_bytes: int) -> None:
    """A topic whose broker-side limit on a record batch is ``max_message_bytes``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        config = {"max.message.bytes": str(max_message_bytes)}
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=config)])
    finally:
        await admin.close()


def rows_by_state(url: str) -> tuple[dict[str, list[int]], list[tuple[bytes, int, str]]]:
    """Attempts of published rows by key, and (key, attempts, last_error) of parked rows."""
    engine = make_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(select(outbox_events).order_by(outbox_events.c.id)).all()
    engine.dispose()
    published: dict[str, list[int]] = defaultdict(list)
    parked = []
    for row in rows:
        if row.parked_ms is not None:
            parked.append((row.kafka_key, row.attempts, row.last_error))
        elif row.published_ms is not None:
            published[row.kafka_key.decode()].append(row.attempts)
    return published, parked


async def test_a_batch_refused_as_too_large_costs_an_attempt_only_to_the_row_too_large_alone(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    # The broker takes batches of at most 20 kB on this topic; 30 rows of 2.5 kB claimed at
    # once make a 75 kB batch (the relay's own limit is 512 kB), and one row of 30 kB is too
    # large even alone, though within the producer's 1 MiB max_request_size.
    await create_small_topic(kafka_bootstrap, topic, 20_000)
    events = [
        new_event("a", "/s", {"n": n, "pad": "x" * 2500}, partitionkey=f"k{n % 5}")
        for n in range(30)
    ]
    events.insert(15, new_event("a", "/s", {"blob": "y" * 30_000}, partitionkey="big"))
    write_events(db_url, topic, events)

    await Relay(
        db_url=db_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=STRICT
    ).drain(timeout_s=scaled(60))

    published, parked = rows_by_state(db_url)
    assert [(key, attempts) for key, attempts, _ in parked] == [(b"big", 1)]
    assert "MessageSizeTooLarge" in parked[0][2]
    assert dict(published) == {f"k{k}": [0] * 6 for k in range(5)}, "no good row paid"
    records = await read_topic(kafka_bootstrap, topic, expected=30)
    order: dict[bytes, list[int]] = defaultdict(list)
    for record in records:
        order[record.key].append(json.loads(record.value)["n"])
    assert order == {f"k{k}".encode(): list(range(k, 30, 5)) for k in range(5)}


async def test_rows_before_a_failed_row_of_their_key_are_no_inversion(
    sqlite_url: str, kafka_bootstrap: str, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    events = [new_event("a", "/s", {"n": n}, partitionkey="k") for n in range(3)]
    events.append(new_event("a", "/s", {"blob": "z" * 5000}, partitionkey="k"))
    events.append(new_event("a", "/s", {"n": 3}, partitionkey="k"))
    write_events(sqlite_url, topic, events)
    options = replace(STRICT, max_request_size=4096)

    with caplog.at_level(logging.WARNING, logger="outboxkit.relay"):
        await Relay(
            db_url=sqlite_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=options
        ).drain(60)

    assert table_counts(sqlite_url) == {"published": 4, "parked": 1, "total": 5}
    records = await read_topic(kafka_bootstrap, topic, expected=4)
    assert [json.loads(r.value)["n"] for r in records] == [0, 1, 2, 3]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [w for w in warnings if "was published" in w], warnings
    assert len([w for w in warnings if "parked" in w]) == 1, warnings


@pytest.fixture(params=["sqlite", "postgresql"])
def unmigrated_url(request: pytest.FixtureRequest, tmp_path: Path) -> object:
    """A database with none of outboxkit's tables."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    request.getfixturevalue("pg_url")  # marks the test as needing PostgreSQL
    with throwaway_database("outboxkit_unmigrated", migrate=False) as url:
        yield url


async def test_a_relay_on_an_unmigrated_database_fails_at_once_saying_so(
    unmigrated_url: str, kafka_bootstrap: str
) -> None:
    relay = Relay(
        db_url=unmigrated_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=STRICT
    )
    with pytest.raises(NotMigratedError, match=MISSING) as raised:
        await asyncio.wait_for(relay.run(), scaled(20))
    assert isinstance(raised.value, OutboxError)
    assert not relay.running
    with pytest.raises(NotMigratedError):
        await asyncio.wait_for(relay.drain(timeout_s=scaled(20)), scaled(30))


@pytest.mark.parametrize("mode", [[], ["--drain"]], ids=["run", "drain"])
def test_relay_command_on_an_unmigrated_database_exits_2_with_one_line(
    pg_url: str, kafka_bootstrap: str, mode: list[str]
) -> None:
    with throwaway_database("outboxkit_unmigrated", migrate=False) as url:
        result = cli_process(
            "relay", "--db-url", url, "--bootstrap", kafka_bootstrap, *mode, timeout=30
        )
    assert result.code == 2, result.err
    assert result.err.strip().splitlines()[-1] == f"outboxkit: error: {MISSING}"
    assert "Traceback" not in result.err
