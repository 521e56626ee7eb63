"""The inbox's partitions on PostgreSQL: a redelivery inside the window is skipped whichever
partition its claim is in, and retention drops partitions whole without forgetting a claim
still inside its consumer's window."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest
from outboxkit.consumers import inbox_partitions, purge_inbox
from outboxkit.consumers.inbox import claim_many
from outboxkit.consumers.inbox_partitions import DAY_MS, purge_partitioned
from outboxkit.consumers.tables import inbox_events, inbox_events_unpartitioned
from outboxkit.migrations.runner import downgrade, upgrade
from outboxkit.ops.inbox import lookup
from outboxkit.outbox.clock import read_db_now_ms as read_now
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.partitions import attach_range, range_partitions
from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from tests.support.locks import locks_left_by_scripts

CONSUMER = "billing"
SOURCE = "/shop"
HOUR_MS = 3_600_000


def uuid7_at(ms: int) -> str:
    """A UUIDv7 whose time is ``ms``."""
    digits = f"{ms:012x}7{secrets.token_hex(2)[1:]}{'89ab'[secrets.randbelow(4)]}"
    digits += secrets.token_hex(8)[1:]
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:32]}"


@pytest.fixture
async def engine(pg_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_async_engine(pg_url)
    yield engine
    await engine.dispose()


async def read_db_now_ms(engine: AsyncEngine) -> int:
    async with engine.connect() as connection:
        return await read_now(connection)


async def claim(engine: AsyncEngine, *event_ids: str) -> set[str]:
    """Claim the events for CONSUMER in one transaction; the ids claimed anew."""
    async with AsyncSession(engine) as session, session.begin():
        fresh = await claim_many(session, CONSUMER, [(SOURCE, i) for i in event_ids])
    return {event_id for _, event_id in fresh}


async def where_claimed(engine: AsyncEngine) -> dict[str, str]:
    """Each claimed event id and the partition its row is in."""
    async with engine.connect() as connection:
        rows = await connection.execute(
            select(text("tableoid::regclass::text"), inbox_events.c.event_id).select_from(
                inbox_events
            )
        )
        return {event_id: partition for partition, event_id in rows}


async def partition_names(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as connection:
        return [p.name for p in await range_partitions(connection, "inbox_events")]


async def attach_day(engine: AsyncEngine, lower: int) -> str:
    """A partition of one day from ``lower`` (past days are not created by consumers)."""
    name = f"inbox_events_p{lower}"
    async with engine.connect() as connection:
        await attach_range(
            connection,
            "inbox_events",
            name,
            key="id_ms",
            lower=lower,
            upper=lower + DAY_MS,
            default="inbox_events_default",
            lock_timeout_ms=5_000,
        )
    return name


async def claims_made(
    engine: AsyncEngine, consumers: tuple[str, ...], first_ms: int, count: int, processed_ms: int
) -> list[str]:
    """Claims of ``count`` events each, with times from ``first_ms`` on, by each of
    ``consumers`` (events of their own), made at ``processed_ms`` (written directly, as if
    applied then); their event ids, a consumer's after another's."""
    rows = [
        {
            "consumer": consumer,
            "source": SOURCE,
            "event_id": uuid7_at(first_ms + n),
            "processed_ms": processed_ms,
            "id_ms": first_ms + n,
        }
        for consumer in consumers
        for n in range(count)
    ]
    async with engine.begin() as connection:
        await connection.execute(insert(inbox_events), rows)
    return [row["event_id"] for row in rows]


async def test_each_claim_lands_in_the_partition_of_its_id_time_and_a_redelivery_is_skipped(
    engine: AsyncEngine,
) -> None:
    now = await read_db_now_ms(engine)
    today = now // DAY_MS * DAY_MS
    early = uuid7_at(now)  # before any consumer's retention attached a partition
    assert await claim(engine, early) == {early}
    assert (await where_claimed(engine))[early] == "inbox_events_default"
    # A runtime's first retention pass: 7-day window, so daily partitions, two days ahead.
    await purge_inbox(engine, consumer=CONSUMER, older_than_s=7 * 86_400, ahead_s=2 * 86_400)
    days = [today + n * DAY_MS for n in range(3) if today + n * DAY_MS < now + 2 * DAY_MS]
    assert [p for p in await partition_names(engine) if p.startswith("inbox_events_p")] == [
        f"inbox_events_p{day}" for day in days
    ]
    assert (await where_claimed(engine))[early] == f"inbox_events_p{today}"  # moved in

    timed, untimed, ahead = uuid7_at(now), "order-17", uuid7_at(now + 3_650 * DAY_MS)
    assert await claim(engine, timed, untimed, ahead, early) == {timed, untimed, ahead}
    assert await where_claimed(engine) == {
        early: f"inbox_events_p{today}",
        timed: f"inbox_events_p{today}",
        untimed: "inbox_events_untimed",
        ahead: "inbox_events_default",  # ten years ahead: no partition covers it
    }
    # Delivered again, one by one and all together: nothing is claimed twice.
    for event_id in (early, timed, untimed, ahead):
        assert await claim(engine, event_id) == set()
    another = uuid7_at(now)
    assert await claim(engine, timed, untimed, ahead, another) == {another}
    async with engine.connect() as connection:
        assert await connection.scalar(select(func.count()).select_from(inbox_events)) == 5


async def test_concurrent_deliveries_of_one_event_claim_it_once(engine: AsyncEngine) -> None:
    event_id = uuid7_at(await read_db_now_ms(engine))
    results = await asyncio.gather(*(claim(engine, event_id) for _ in range(8)))
    assert sum(len(fresh) for fresh in results) == 1


async def test_a_dropped_partition_keeps_the_claims_still_inside_their_window(
    engine: AsyncEngine,
) -> None:
    now = await read_db_now_ms(engine)
    old_day = (now - 10 * DAY_MS) // DAY_MS * DAY_MS
    partition = await attach_day(engine, old_day)
    # applied two hours ago, when they were fresh
    forgotten = await claims_made(engine, (CONSUMER,), old_day, 3, now - 2 * HOUR_MS)
    late = uuid7_at(old_day + 500)  # ten days old, applied just now by a lagging consumer
    assert await claim(engine, late) == {late}
    assert (await where_claimed(engine))[late] == partition

    assert await purge_inbox(engine, consumer=CONSUMER, older_than_s=3600) == 3

    assert partition not in await partition_names(engine)
    assert await where_claimed(engine) == {late: "inbox_events_default"}
    assert await claim(engine, late) == set()  # inside its window: still a duplicate
    assert await claim(engine, forgotten[0]) == {forgotten[0]}  # outside: applied again


async def test_a_partition_is_kept_while_it_holds_claims_of_a_consumer_without_retention(
    engine: AsyncEngine,
) -> None:
    now = await read_db_now_ms(engine)
    old_day = (now - 10 * DAY_MS) // DAY_MS * DAY_MS
    partition = await attach_day(engine, old_day)
    # "audit" never ran retention
    await claims_made(engine, (CONSUMER, "audit"), old_day, 5, old_day)
    capped = inbox_partitions.KEEP_CAP
    inbox_partitions.KEEP_CAP = 4
    try:
        done = await purge_partitioned(engine, consumer=CONSUMER, window_ms=HOUR_MS, chunk_size=100)
    finally:
        inbox_partitions.KEEP_CAP = capped
    assert [p.name for p in done.postponed] == [partition] and not done.dropped
    assert len(await where_claimed(engine)) == 10  # nothing forgotten

    done = await purge_partitioned(engine, consumer=CONSUMER, window_ms=HOUR_MS, chunk_size=100)
    assert [(d.name, d.rows, d.kept) for d in done.dropped] == [(partition, 10, 5)]
    async with engine.connect() as connection:
        kept = (await connection.execute(select(inbox_events.c.consumer))).scalars().all()
    assert kept == ["audit"] * 5


async def test_a_partition_attached_ahead_takes_over_claims_written_before_it_existed(
    engine: AsyncEngine,
) -> None:
    now = await read_db_now_ms(engine)
    early = uuid7_at(now + 5 * DAY_MS)  # a producer clock five days fast
    assert await claim(engine, early) == {early}
    assert (await where_claimed(engine))[early] == "inbox_events_default"
    done = await purge_partitioned(
        engine, consumer=CONSUMER, window_ms=7 * DAY_MS, chunk_size=100, ahead_ms=6 * DAY_MS
    )
    day = (now + 5 * DAY_MS) // DAY_MS * DAY_MS
    assert f"inbox_events_p{day}" in done.created
    assert (await where_claimed(engine))[early] == f"inbox_events_p{day}"
    assert await claim(engine, early) == set()


async def test_claims_made_before_the_upgrade_still_count_and_expire(pg_url: str) -> None:
    downgrade(pg_url, "0015_awaiting_decisions")
    engine = make_async_engine(pg_url)
    try:
        now = await read_db_now_ms(engine)
        before = [uuid7_at(now - HOUR_MS), "legacy-2"]
        async with engine.begin() as connection:
            await connection.execute(
                text(
                    "INSERT INTO inbox_events (consumer, source, event_id, processed_ms) "
                    "VALUES (:c, :s, :e, :p)"
                ),
                [
                    {"c": CONSUMER, "s": SOURCE, "e": before[0], "p": now - HOUR_MS},
                    {"c": CONSUMER, "s": SOURCE, "e": before[1], "p": now - 3 * HOUR_MS},
                ],
            )
        await engine.dispose()
        upgrade(pg_url)
        assert await claim(engine, *before) == set()  # applied before the upgrade
        fresh = uuid7_at(now)
        assert await claim(engine, fresh, *before) == {fresh}
        # The operator's look-up sees both sides.
        assert [a.consumer for a in await lookup(engine, SOURCE, before[0])] == [CONSUMER]
        assert [a.consumer for a in await lookup(engine, SOURCE, fresh)] == [CONSUMER]
        assert await lookup(engine, SOURCE, uuid7_at(now)) == []

        assert await purge_inbox(engine, consumer=CONSUMER, older_than_s=2 * 3600) == 1
        async with engine.connect() as connection:
            left = (
                await connection.execute(select(inbox_events_unpartitioned.c.event_id))
            ).scalars()
            assert list(left) == [before[0]]
        assert await claim(engine, before[1]) == {before[1]}  # forgotten, so applied again
        assert await claim(engine, before[0]) == set()
    finally:
        await engine.dispose()


async def test_a_claim_in_flight_in_a_partition_keeps_it_until_it_commits(
    engine: AsyncEngine,
) -> None:
    """The drop waits for no writer longer than its lock timeout: a claim transaction open in
    the partition makes the pass leave it (busy); the next pass drops it and keeps the claim."""
    now = await read_db_now_ms(engine)
    old_day = (now - 10 * DAY_MS) // DAY_MS * DAY_MS
    partition = await attach_day(engine, old_day)
    late = uuid7_at(old_day + 7)
    async with AsyncSession(engine) as session, session.begin():
        assert await claim_many(session, CONSUMER, [(SOURCE, late)]) == {(SOURCE, late)}
        done = await purge_partitioned(engine, consumer=CONSUMER, window_ms=HOUR_MS, chunk_size=100)
        assert done.busy == [partition] and not done.dropped
    done = await purge_partitioned(engine, consumer=CONSUMER, window_ms=HOUR_MS, chunk_size=100)
    assert [(d.name, d.kept) for d in done.dropped] == [(partition, 1)]
    assert await where_claimed(engine) == {late: "inbox_events_default"}
    assert await claim(engine, late) == set()


async def test_a_claim_in_flight_in_the_default_partition_is_taken_over_once_it_commits(
    engine: AsyncEngine,
) -> None:
    """A claim written to the default partition for a range about to be attached, still
    uncommitted: the attach waits no longer than its lock timeout (busy), and the next pass
    attaches the range with the claim moved into it."""
    now = await read_db_now_ms(engine)
    ahead = uuid7_at(now + 3 * DAY_MS)
    async with AsyncSession(engine) as session, session.begin():
        assert await claim_many(session, CONSUMER, [(SOURCE, ahead)]) == {(SOURCE, ahead)}
        done = await purge_partitioned(
            engine, consumer=CONSUMER, window_ms=7 * DAY_MS, chunk_size=100, ahead_ms=4 * DAY_MS
        )
        assert done.busy and (await where_claimed(engine)).get(ahead) is None  # not visible yet
    day = (now + 3 * DAY_MS) // DAY_MS * DAY_MS
    assert f"inbox_events_p{day}" not in await partition_names(engine)
    done = await purge_partitioned(
        engine, consumer=CONSUMER, window_ms=7 * DAY_MS, chunk_size=100, ahead_ms=4 * DAY_MS
    )
    assert f"inbox_events_p{day}" in done.created and not done.busy
    assert (await where_claimed(engine))[ahead] == f"inbox_events_p{day}"
    assert await claim(engine, ahead) == set()


async def test_an_attach_holds_no_lock_once_its_statement_returns(
    engine: AsyncEngine, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Locking the default partition, moving its claims of the range and attaching are one
    statement in autocommit: when its result reaches the client every lock is gone (none
    waits for a round trip of the client's), and the claim it moved is in the partition."""
    now = await read_db_now_ms(engine)
    early = uuid7_at(now + 5 * DAY_MS)
    assert await claim(engine, early) == {early}
    observer = make_engine(pg_url)
    locks_after_attach = locks_left_by_scripts(monkeypatch, observer, "ATTACH PARTITION")
    day = (now + 5 * DAY_MS) // DAY_MS * DAY_MS
    try:
        async with engine.connect() as connection:
            moved = await attach_range(
                connection,
                "inbox_events",
                f"inbox_events_p{day}",
                key="id_ms",
                lower=day,
                upper=day + DAY_MS,
                default="inbox_events_default",
                lock_timeout_ms=5_000,
            )
    finally:
        observer.dispose()
    assert moved == 1 and locks_after_attach == [0]
    assert (await where_claimed(engine))[early] == f"inbox_events_p{day}"


async def test_a_drop_holds_no_lock_once_its_statement_returns(
    engine: AsyncEngine, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Locking the inbox, counting the claims to keep, detaching and moving them are one
    statement in autocommit: when its result reaches the client every lock is gone, and the
    claim still inside its window is in the default partition."""
    now = await read_db_now_ms(engine)
    old_day = (now - 10 * DAY_MS) // DAY_MS * DAY_MS
    partition = await attach_day(engine, old_day)
    late = uuid7_at(old_day + 500)
    assert await claim(engine, late) == {late}
    observer = make_engine(pg_url)
    locks_after_drop = locks_left_by_scripts(monkeypatch, observer, "DETACH PARTITION")
    try:
        done = await purge_partitioned(engine, consumer=CONSUMER, window_ms=HOUR_MS, chunk_size=100)
    finally:
        observer.dispose()
    assert [(d.name, d.rows, d.kept) for d in done.dropped] == [(partition, 1, 1)]
    assert locks_after_drop == [0]
    assert (await where_claimed(engine))[late] == "inbox_events_default"


async def test_the_window_one_consumer_recorded_applies_in_another_consumers_pass(
    engine: AsyncEngine,
) -> None:
    """A runtime's pass records its consumer's window (a locked block): the next pass, of
    another consumer, forgets that consumer's claims older than it instead of keeping them
    all as a consumer's without retention."""
    await purge_partitioned(
        engine, consumer="audit", window_ms=2 * HOUR_MS, chunk_size=100, ahead_ms=HOUR_MS
    )
    now = await read_db_now_ms(engine)
    old_day = (now - 10 * DAY_MS) // DAY_MS * DAY_MS
    partition = await attach_day(engine, old_day)
    await claims_made(engine, (CONSUMER, "audit"), old_day, 2, now - 3 * HOUR_MS)
    done = await purge_partitioned(engine, consumer=CONSUMER, window_ms=HOUR_MS, chunk_size=100)
    assert [(d.name, d.rows, d.kept) for d in done.dropped] == [(partition, 4, 0)]


async def test_a_window_that_grew_after_the_pass_read_it_postpones_the_drop(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another consumer lengthens its window between a pass's read of the windows and its
    drop: the drop, finding under the lock a window longer than the one it read, waits for the
    next pass rather than forget that consumer's claims inside it; the next pass keeps them."""
    now = await read_db_now_ms(engine)
    await purge_partitioned(
        engine, consumer="audit", window_ms=5 * DAY_MS, chunk_size=100, ahead_ms=HOUR_MS
    )
    old_day = (now - 10 * DAY_MS) // DAY_MS * DAY_MS
    partition = await attach_day(engine, old_day)
    # inside audit's 5 days, not in 1 hour
    await claims_made(engine, (CONSUMER, "audit"), old_day, 3, now - 2 * DAY_MS)
    read = inbox_partitions._windows

    async def read_before_audit_grew(connection: object) -> dict[str, int]:
        return {"audit": HOUR_MS}  # what a pass read just before audit recorded 5 days

    monkeypatch.setattr(inbox_partitions, "_windows", read_before_audit_grew)
    done = await purge_partitioned(engine, consumer=CONSUMER, window_ms=HOUR_MS, chunk_size=100)
    assert [p.name for p in done.postponed] == [partition] and not done.dropped
    assert len(await where_claimed(engine)) == 6

    monkeypatch.setattr(inbox_partitions, "_windows", read)
    done = await purge_partitioned(engine, consumer=CONSUMER, window_ms=HOUR_MS, chunk_size=100)
    assert [(d.name, d.rows, d.kept) for d in done.dropped] == [(partition, 6, 3)]
    async with engine.connect() as connection:
        kept = (await connection.execute(select(inbox_events.c.consumer))).scalars().all()
    assert sorted(kept) == ["audit"] * 3
