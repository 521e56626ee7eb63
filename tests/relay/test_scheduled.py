"""Scheduled delivery against real Kafka, on SQLite and PostgreSQL: not before its time (the
database clock), then soon after; never holding back its key; due order within a key."""

from __future__ import annotations

import asyncio
import random
import statistics
from datetime import UTC, datetime, timedelta

import pytest
from outboxkit.outbox import InvalidEventError, Outbox, new_event
from outboxkit.outbox.clock import db_now_ms
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.tables import outbox_events
from outboxkit.relay import Relay, RelayOptions
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tests.support.kafka import read_topic, wait_for
from tests.support.waits import scaled

FAST = RelayOptions(lease_ttl_s=5.0, request_timeout_s=2.0, poll_interval_s=1.0)


def now_ms(url: str) -> int:
    """The database clock."""
    engine = make_engine(url)
    with engine.connect() as connection:
        value = int(connection.scalar(select(db_now_ms(engine.dialect.name))) or 0)
    engine.dispose()
    return value


def write(url: str, topic: str, *events: tuple[str, str, float | None]) -> dict[str, int | None]:
    """Write ``(event id, key, delay_s)`` events in one transaction; return each row's
    ``deliver_at_ms``."""
    engine = make_engine(url)
    outbox = Outbox(default_topic=topic)
    with Session(engine) as session, session.begin():
        for event_id, key, delay_s in events:
            event = new_event("t", "/s", {"id": event_id}, id=event_id, partitionkey=key)
            assert outbox.add(session, event, delay_s=delay_s)
    with engine.connect() as connection:
        rows = connection.execute(select(outbox_events.c.event_id, outbox_events.c.deliver_at_ms))
        due = {row.event_id: row.deliver_at_ms for row in rows}
    engine.dispose()
    return due


def published_ms(url: str) -> dict[str, int]:
    """``published_ms`` of each published row, by event id."""
    engine = make_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(
            select(outbox_events.c.event_id, outbox_events.c.published_ms).where(
                outbox_events.c.published_ms.is_not(None)
            )
        )
        marks = {row.event_id: row.published_ms for row in rows}
    engine.dispose()
    return marks


async def write_async(url: str, topic: str, *events: tuple[str, str, float | None]) -> dict:
    """:func:`write` in a thread: a blocking SQLite write would hold up the relay's own."""
    return await asyncio.to_thread(write, url, topic, *events)


async def marks_of(url: str) -> dict[str, int]:
    """:func:`published_ms` in a thread."""
    return await asyncio.to_thread(published_ms, url)


async def db_now(url: str) -> int:
    """:func:`now_ms` in a thread."""
    return await asyncio.to_thread(now_ms, url)


def ids_of(records: list) -> list[str]:
    return [dict(record.headers)["ce_id"].decode() for record in records]


async def test_a_scheduled_event_waits_for_its_time_without_holding_back_its_key(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    kafka = KafkaSettings(bootstrap=kafka_bootstrap)
    async with Relay(db_url=db_url, kafka=kafka, options=FAST):
        # The approval must go out before the timer is due: the delay is sized for the load
        # (a loaded machine took over 2.5 s to publish the approval).
        due = await write_async(db_url, topic, ("timer", "k", scaled(2.5)))
        await write_async(db_url, topic, ("approval", "k", None))  # same key
        marks = await wait_for(
            lambda: marks_of(db_url), lambda m: "approval" in m, 60, "the approval"
        )
        timer_due = due["timer"]
        assert timer_due is not None
        # The approval went out while the timer was still waiting (database clock).
        assert "timer" not in marks and marks["approval"] < timer_due
        early = await read_topic(kafka_bootstrap, topic, expected=1, timeout=5)
        assert ids_of(early) == ["approval"]
        assert await db_now(db_url) < timer_due, "once the timer is due the read proves nothing"

        marks = await wait_for(lambda: marks_of(db_url), lambda m: "timer" in m, 60, "timer")
        assert marks["timer"] >= timer_due
    records = await read_topic(kafka_bootstrap, topic, expected=2)
    assert ids_of(records) == ["approval", "timer"]
    assert records[1].timestamp >= timer_due  # the producer's clock: this machine's, as the db's


async def test_due_events_of_one_key_go_in_due_order_then_write_order(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    """The relay is down until everything is due: one claim sees all of them at once."""
    due = write(
        db_url,
        topic,
        ("later-timer", "k", 1.6),
        ("sooner-timer", "k", 0.8),
        ("first", "k", None),
        ("same-time-a", "k", 1.2),
        ("same-time-b", "k", 5.0),  # made due at the same millisecond as a: write order
    )
    due["same-time-b"] = due["same-time-a"]
    engine = make_engine(db_url)
    with engine.begin() as connection:
        connection.execute(
            outbox_events.update()
            .where(outbox_events.c.event_id == "same-time-b")
            .values(deliver_at_ms=due["same-time-a"])
        )
    engine.dispose()
    latest = max(v for v in due.values() if v is not None)
    await wait_for(lambda: db_now(db_url), lambda now: now > latest, 60, "all due")
    write(db_url, topic, ("last", "k", None), ("past", "k", -5.0))  # past means now

    relay = Relay(db_url=db_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=FAST)
    assert await relay.drain(timeout_s=60) == 7
    records = await read_topic(kafka_bootstrap, topic, expected=7)
    assert ids_of(records) == [
        "first",
        "sooner-timer",
        "same-time-a",
        "same-time-b",
        "later-timer",
        "last",
        "past",
    ]


async def test_rollback_leaves_no_scheduled_row(db_url: str) -> None:
    engine = make_engine(db_url)
    outbox = Outbox(default_topic="orders")
    with Session(engine) as session, session.begin():
        event = new_event("t", "/s", {"n": 1}, partitionkey="k")
        at = datetime.now(UTC) + timedelta(seconds=60)
        assert outbox.add(session, event, deliver_at=at)
        inside = session.scalar(select(outbox_events.c.deliver_at_ms))
        assert inside == int(at.timestamp() * 1000)
        session.rollback()
    with engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(outbox_events)) == 0
    engine.dispose()


async def test_a_restarted_relay_publishes_each_pending_timer_once_when_due(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    """Three timers due soon, seven a load-sized gap later: the first relay stops after the
    three, with the seven pending (on a loaded machine three timers 0.25 s apart were all
    published before the stop took effect)."""
    kafka = KafkaSettings(bootstrap=kafka_bootstrap)
    later = scaled(2.0)
    timers = [
        (f"timer-{n}", f"k{n % 3}", 0.5 + 0.25 * n + (later if n >= 3 else 0.0)) for n in range(10)
    ]
    first = Relay(db_url=db_url, kafka=kafka, options=FAST)
    await first.start()
    due = await write_async(db_url, topic, *timers)
    await wait_for(lambda: marks_of(db_url), lambda m: len(m) >= 3, 60, "some timers")
    await first.stop()  # some published, the rest still pending
    published_first = first.stats.published
    assert published_first == 3
    async with Relay(db_url=db_url, kafka=kafka, options=FAST) as second:
        marks = await wait_for(lambda: marks_of(db_url), lambda m: len(m) == 10, 60, "every timer")
        assert second.stats.published == 10 - published_first
    assert all(marks[event_id] >= due_ms for event_id, due_ms in due.items() if due_ms)
    records = await read_topic(kafka_bootstrap, topic, expected=10)
    assert sorted(ids_of(records)) == sorted(event_id for event_id, _, _ in timers)


async def test_timers_fire_soon_after_their_due_time_in_due_order_per_key(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    """50 timers over about 3 s, written in random order; poll interval 1 s. Lateness is the
    record's timestamp (the relay's clock, this machine's, as the database's) minus the due
    time (database clock)."""
    kafka = KafkaSettings(bootstrap=kafka_bootstrap)
    rng = random.Random(12)
    timers = [(f"timer-{n:02d}", f"k{n % 5}", rng.uniform(0.5, 3.0)) for n in range(50)]
    rng.shuffle(timers)
    async with Relay(db_url=db_url, kafka=kafka, options=FAST):
        due: dict[str, int | None] = {}
        for chunk in range(0, 50, 10):  # a few transactions, as several writers would
            due.update(await write_async(db_url, topic, *timers[chunk : chunk + 10]))
        await wait_for(lambda: marks_of(db_url), lambda m: len(m) == 50, 60, "every timer")
    records = await read_topic(kafka_bootstrap, topic, expected=50)
    assert len(records) == 50
    lateness_ms = []
    for record in records:
        due_ms = due[dict(record.headers)["ce_id"].decode()]
        assert due_ms is not None and record.timestamp >= due_ms
        lateness_ms.append(record.timestamp - due_ms)
    for key in {key for _, key, _ in timers}:
        mine = [r for r in records if r.key == key.encode()]
        assert [due[i] for i in ids_of(mine)] == sorted(due[i] for i in ids_of(mine))  # type: ignore[type-var]
    p50, worst = statistics.median(lateness_ms), max(lateness_ms)
    print(f"\n{db_url.split(':')[0]}: 50 timers, lateness p50 {p50:.0f} ms, max {worst} ms")
    # Each fires at the first poll after it is due: within a poll interval on a quiet machine,
    # a few on a loaded one (the promise is "soon", not a latency figure: bench/ measures that).
    assert worst < scaled(FAST.poll_interval_s) * 1000, lateness_ms


def test_naive_and_malformed_schedules_are_refused_before_anything_is_written(
    sqlite_url: str,
) -> None:
    engine = make_engine(sqlite_url)
    outbox = Outbox(default_topic="orders")
    event = new_event("t", "/s", {"n": 1})
    with Session(engine) as session, session.begin():
        with pytest.raises(InvalidEventError, match="timezone-aware"):
            outbox.add(session, event, deliver_at=datetime.now() + timedelta(seconds=5))
        with pytest.raises(InvalidEventError, match="not both"):
            outbox.add(session, event, deliver_at=datetime.now(UTC), delay_s=1.0)
        for bad in (float("nan"), float("inf"), "5", True):
            with pytest.raises(InvalidEventError, match="delay_s"):
                outbox.add(session, event, delay_s=bad)  # type: ignore[arg-type]
        count = session.scalar(select(func.count()).select_from(outbox_events))
    engine.dispose()
    assert count == 0


async def test_a_time_not_in_the_future_is_now_and_a_delay_counts_on_the_database_clock(
    db_url: str,
) -> None:
    engine = make_engine(db_url)
    outbox = Outbox(default_topic="orders")
    before = now_ms(db_url)
    with Session(engine) as session, session.begin():
        past = datetime.now(UTC) - timedelta(seconds=1)
        outbox.add(session, new_event("t", "/s", id="past"), deliver_at=past)
        outbox.add(session, new_event("t", "/s", id="zero"), delay_s=0)
        outbox.add(session, new_event("t", "/s", id="in-a-minute"), delay_s=60)
        at = datetime.now(UTC).astimezone(UTC) + timedelta(hours=2)
        outbox.add(session, new_event("t", "/s", id="at"), deliver_at=at)
    after = now_ms(db_url)
    with engine.connect() as connection:
        rows = connection.execute(select(outbox_events.c.event_id, outbox_events.c.deliver_at_ms))
        deliver_at = {row.event_id: row.deliver_at_ms for row in rows}
    engine.dispose()
    assert deliver_at["past"] is None and deliver_at["zero"] is None
    assert before + 60_000 <= deliver_at["in-a-minute"] <= after + 60_000
    assert deliver_at["at"] == int(at.timestamp() * 1000)


async def test_status_counts_scheduled_rows_apart_from_the_backlog(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    """Scheduled rows written ten minutes ago and due in five are no backlog and trip no
    --max-oldest-age; a scheduled row due two minutes ago is backlog, two minutes old."""
    from tests.support.ops import cli

    write(db_url, topic, ("now", "k", None), *[(f"later-{n}", "k", 300.0) for n in range(3)])
    engine = make_engine(db_url)
    with engine.begin() as connection:
        connection.execute(
            outbox_events.update().values(created_ms=outbox_events.c.created_ms - 600_000)
        )
        connection.execute(
            outbox_events.update()
            .where(outbox_events.c.event_id == "now")
            .values(created_ms=outbox_events.c.created_ms + 600_000)
        )
    engine.dispose()
    common = ("--db-url", db_url, "--bootstrap", kafka_bootstrap)

    report = (await cli("status", "--json", *common)).json()
    outbox = report["outbox"]
    assert (outbox["backlog"], outbox["scheduled"]) == (1, 3)
    assert outbox["oldest_age_s"] < 60
    assert 240 < outbox["next_due_in_s"] <= 300
    text = await cli("status", *common, "--max-oldest-age", "60")
    assert "backlog 1," in text.out and "scheduled 3, next due in 4m" in text.out, text.out
    assert "threshold crossed" not in text.err

    listed = await cli("outbox", "list", "--json", "--db-url", db_url)
    assert (listed.json()["pending"], listed.json()["scheduled"]) == (1, 3)
    later = await cli("outbox", "list", "--scheduled", "--db-url", db_url)
    assert "3 scheduled outbox row(s)" in later.out and "(in 4m" in later.out, later.out

    two_minutes_ago = now_ms(db_url) - 120_000
    engine = make_engine(db_url)
    with engine.begin() as connection:  # one of them came due two minutes ago, unpublished
        connection.execute(
            outbox_events.update()
            .where(outbox_events.c.event_id == "later-0")
            .values(deliver_at_ms=two_minutes_ago)
        )
    engine.dispose()
    late = await cli("status", "--json", *common, "--max-oldest-age", "60")
    assert late.code == 1
    assert (late.json()["outbox"]["backlog"], late.json()["outbox"]["scheduled"]) == (2, 2)
    assert 120 <= late.json()["outbox"]["oldest_age_s"] < 180
    assert "oldest unpublished outbox row is 12" in late.err
