"""Dead letters that keep the order (``on_dead_letter="sequence"``), on real Kafka and databases.

Key K carries widgets 1..10 and key L widgets 101..105, interleaved on one partition; widget 3
is poison. In sequence mode K's 4..10 wait, held, behind the dead-lettered 3 while L goes on;
replaying 3 once it is fixed applies 3 and then 4..10 in order; skipping it releases 4..10.
Effects are rows of ``consumer_effects`` in commit order, so their order is the order applied.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers.tables import consumer_held_events, consumer_sequences
from outboxkit.outbox import new_event
from outboxkit.testing.kafka import create_topic

from tests.support.consumer_apps import WIDGET_TYPE
from tests.support.consumers import (
    alive,
    committed_offsets,
    count_rows,
    effect_rows,
    produce_events,
    running,
)
from tests.support.kafka import wait_for
from tests.support.ops import cli
from tests.support.sequence_apps import create_tables, fix, sequence_app, start

# Sized for a loaded machine: a consumer group's first join and the retries take seconds there.
DEADLINE_S = 120.0


def keyed(n: int, key: str) -> CloudEvent:
    """Widget ``n`` on partition key ``key``, with a deterministic id."""
    return new_event(WIDGET_TYPE, "/widgets", {"n": n}, id=f"w-{n}", partitionkey=key)


def interleaved() -> list[CloudEvent]:
    """K's 1..10 with L's 101..105 between them."""
    events: list[CloudEvent] = []
    for n in range(1, 11):
        events.append(keyed(n, "K"))
        if n <= 5:
            events.append(keyed(100 + n, "L"))
    return events


def applied(db_url: str, low: int, high: int) -> list[int]:
    """The widgets between ``low`` and ``high`` in the order their effects committed."""
    return [row.n for row in effect_rows(db_url) if low <= row.n <= high]


async def rows(db_url: str, table: Any) -> int:
    """``count_rows`` off the event loop: a runtime in this loop may hold SQLite's lock."""
    return await asyncio.to_thread(count_rows, db_url, table)


async def applied_now(db_url: str, low: int, high: int) -> list[int]:
    """``applied`` off the event loop."""
    return await asyncio.to_thread(applied, db_url, low, high)


async def blocked_behind_three(db_url: str, bootstrap: str, topic: str, runtime, task) -> None:  # type: ignore[no-untyped-def]
    """Wait until K is blocked behind 3 with 4..10 held and L applied; check the books."""
    await wait_for(
        lambda: (
            alive(task) or (runtime.stats.applied, runtime.stats.held, runtime.stats.dead_lettered)
        ),
        lambda seen: seen == (7, 7, 1),
        DEADLINE_S,
        "2 of K and 5 of L applied, 7 held, 1 dead-lettered",
    )
    assert await applied_now(db_url, 1, 10) == [1, 2]
    assert await applied_now(db_url, 101, 105) == [101, 102, 103, 104, 105]
    assert await rows(db_url, consumer_held_events) == 7
    assert await rows(db_url, consumer_sequences) == 1
    # Offsets go on: nothing depends on the partition staying paused.
    await wait_for(
        lambda: committed_offsets(bootstrap, runtime.group),
        lambda offsets: offsets.get(TopicPartition(topic, 0)) == 15,
        DEADLINE_S,
        "all 15 offsets committed",
    )


async def test_the_later_records_of_a_key_wait_behind_its_dead_letter_until_it_is_replayed(
    db_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_tables(db_url, poison=[3])
    await create_topic(kafka_bootstrap, topic)
    await produce_events(kafka_bootstrap, topic, interleaved())
    async with running(sequence_app(topic), db_url, kafka_bootstrap) as (runtime, task):
        await blocked_behind_three(db_url, kafka_bootstrap, topic, runtime, task)
        listed = await cli("dlq", "sequences", "list", "--db-url", db_url, "--json")
        assert listed.code == 0, listed.err
        (key,) = listed.json()["keys"]
        assert (key["key"], key["state"], key["held"]) == ("K", "blocked", 7)
        assert key["head"]["id"] == "w-3"
        assert key["head"]["error_class"] == "permanent:WidgetRejected"
        status = await cli("status", "--db-url", db_url, "--bootstrap", kafka_bootstrap, "--json")
        sequences = status.json()["sequences"]
        assert (sequences["blocked_keys"], sequences["held"]) == (1, 7), status.out
        await wait_for(runtime.blocked_keys, lambda seen: seen == (1, 7), DEADLINE_S, "gauges")

        fix(db_url, 3)
        replay = await cli(
            "dlq", "replay", f"{topic}.dlq", "--by", "tester", "--json",
            "--bootstrap", kafka_bootstrap, "--db-url", db_url,
        )  # fmt: skip
        assert replay.code == 0, replay.err
        assert replay.json()["replayed"] == 1
        await wait_for(
            lambda: alive(task) or rows(db_url, consumer_sequences),
            lambda rows: rows == 0,
            DEADLINE_S,
            "the key released",
        )
        # A live record of K after the release is applied after the held ones.
        await produce_events(kafka_bootstrap, topic, [keyed(11, "K")])
        await wait_for(
            lambda: alive(task) or applied_now(db_url, 1, 11),
            lambda ns: 11 in ns,
            DEADLINE_S,
            "widget 11",
        )
    assert applied(db_url, 1, 11) == list(range(1, 12))  # each once, in K's order
    assert applied(db_url, 101, 105) == [101, 102, 103, 104, 105]
    assert count_rows(db_url, consumer_held_events) == 0


async def test_the_default_policy_applies_the_later_records_over_the_dead_letter(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    """What sequence mode is for: without it, 4..10 are applied before 3 is replayed."""
    create_tables(pg_url, poison=[3])
    await create_topic(kafka_bootstrap, topic)
    await produce_events(kafka_bootstrap, topic, interleaved())
    app = sequence_app(topic)
    app.on_dead_letter = "continue"
    for handler_key, handler in list(app.handlers.items()):
        app.handlers[handler_key] = type(handler)(
            **{**handler.__dict__, "on_dead_letter": "continue"}
        )
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied, lambda n: n == 14, DEADLINE_S, "14"
        )
    assert applied(pg_url, 1, 10) == [1, 2, 4, 5, 6, 7, 8, 9, 10]
    assert count_rows(pg_url, consumer_sequences) == 0


async def test_skipping_the_head_releases_the_held_records_in_order(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_tables(pg_url, poison=[3])
    await create_topic(kafka_bootstrap, topic)
    await produce_events(kafka_bootstrap, topic, interleaved())
    async with running(sequence_app(topic), pg_url, kafka_bootstrap) as (runtime, task):
        await blocked_behind_three(pg_url, kafka_bootstrap, topic, runtime, task)
        common = ("--consumer", "billing", "--topic", topic, "--key", "K", "--db-url", pg_url)
        refused = await cli("dlq", "sequences", "skip", *common[:4], "--key", "X", "--reason", "r",
                            "--db-url", pg_url)  # fmt: skip
        assert refused.code == 2 and "is not blocked" in refused.error_line()
        skipped = await cli(
            "dlq",
            "sequences",
            "skip",
            *common,
            "--reason",
            "a duplicate",
            "--by",
            "alice",
            "--json",
        )
        assert skipped.code == 0, skipped.err
        assert skipped.json() == {"resolution": "skipped", "released": 1, "held": 7, "key": "K"}
        await wait_for(
            lambda: alive(task) or rows(pg_url, consumer_sequences),
            lambda rows: rows == 0,
            DEADLINE_S,
            "the key released",
        )
    assert applied(pg_url, 1, 10) == [1, 2, 4, 5, 6, 7, 8, 9, 10]  # 3 given up, on purpose


async def test_a_held_record_that_fails_in_turn_becomes_the_new_head(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_tables(pg_url, poison=[3, 6])
    await create_topic(kafka_bootstrap, topic)
    await produce_events(kafka_bootstrap, topic, interleaved())
    common = ("--by", "tester", "--json", "--bootstrap", kafka_bootstrap, "--db-url", pg_url)
    async with running(sequence_app(topic), pg_url, kafka_bootstrap) as (runtime, task):
        await blocked_behind_three(pg_url, kafka_bootstrap, topic, runtime, task)
        fix(pg_url, 3)
        assert (await cli("dlq", "replay", f"{topic}.dlq", *common)).json()["replayed"] == 1
        await wait_for(
            lambda: alive(task) or runtime.stats.dead_lettered, lambda n: n == 2, DEADLINE_S, "6"
        )
        listed = (await cli("dlq", "sequences", "list", "--db-url", pg_url, "--json")).json()
        (key,) = listed["keys"]
        assert (key["state"], key["held"], key["head"]["id"]) == ("blocked", 4, "w-6")
        assert await applied_now(pg_url, 1, 10) == [1, 2, 3, 4, 5]
        fix(pg_url, 6)
        # The ledger knows the first letter was replayed: only 6's goes out now.
        assert (await cli("dlq", "replay", f"{topic}.dlq", *common)).json()["replayed"] == 1
        await wait_for(
            lambda: alive(task) or rows(pg_url, consumer_sequences),
            lambda rows: rows == 0,
            DEADLINE_S,
            "the key released",
        )
    assert applied(pg_url, 1, 10) == list(range(1, 11))


async def test_a_consumer_killed_while_releasing_resumes_and_applies_each_once_in_order(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    create_tables(pg_url, poison=[3])
    await create_topic(kafka_bootstrap, topic)
    await produce_events(kafka_bootstrap, topic, interleaved())
    group = f"billing-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "consumers.log"
    first = start(pg_url, kafka_bootstrap, group, topic, log)
    try:
        await wait_for(
            lambda: (count_rows(pg_url, consumer_held_events), len(applied(pg_url, 101, 105))),
            lambda seen: seen == (7, 5),
            DEADLINE_S,
            "7 held and L applied",
        )
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0, log.read_text()
    fix(pg_url, 3)
    replay = await cli(
        "dlq", "replay", f"{topic}.dlq", "--by", "t", "--bootstrap", kafka_bootstrap,
        "--db-url", pg_url,
    )  # fmt: skip
    assert replay.code == 0, replay.err
    # The head and two held records commit, then the process dies before anything else.
    crashing = start(pg_url, kafka_bootstrap, group, topic, log, crash_after_commits=3)
    assert crashing.wait(DEADLINE_S) == -signal.SIGKILL, log.read_text()
    assert applied(pg_url, 1, 10) == [1, 2, 3, 4, 5]
    assert count_rows(pg_url, consumer_held_events) == 5
    last = start(pg_url, kafka_bootstrap, group, topic, log)
    try:
        await wait_for(
            lambda: count_rows(pg_url, consumer_sequences),
            lambda rows: rows == 0,
            DEADLINE_S,
            "the key released after the crash",
        )
    finally:
        last.send_signal(signal.SIGTERM)
        assert last.wait(60) == 0, log.read_text()
    assert applied(pg_url, 1, 10) == list(range(1, 11))  # each once, in order
    assert count_rows(pg_url, consumer_held_events) == 0


async def test_a_rebalance_while_a_key_is_held_keeps_its_order(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_tables(pg_url, poison=[3])
    await create_topic(kafka_bootstrap, topic, partitions=2)
    await produce_events(kafka_bootstrap, topic, interleaved())
    app = sequence_app(topic)
    async with running(app, pg_url, kafka_bootstrap) as (first, first_task):
        await wait_for(
            lambda: alive(first_task) or (first.stats.held, first.stats.dead_lettered),
            lambda seen: seen == (7, 1),
            DEADLINE_S,
            "7 held behind 3",
        )
        async with running(sequence_app(topic), pg_url, kafka_bootstrap, group=first.group) as (
            second,
            second_task,
        ):
            await wait_for(
                lambda: (
                    alive(first_task)
                    or alive(second_task)
                    or (len(first.assignment), len(second.assignment))
                ),
                lambda sizes: sizes == (1, 1),
                DEADLINE_S,
                "the partitions shared by both members",
            )
            fix(pg_url, 3)
            replay = await cli(
                "dlq", "replay", f"{topic}.dlq", "--by", "t", "--bootstrap", kafka_bootstrap,
                "--db-url", pg_url,
            )  # fmt: skip
            assert replay.code == 0, replay.err
            await wait_for(
                lambda: alive(first_task) or alive(second_task) or rows(pg_url, consumer_sequences),
                lambda left: left == 0,
                DEADLINE_S,
                "the key released by whichever member owns it",
            )
    assert applied(pg_url, 1, 10) == list(range(1, 11))
    assert sorted(applied(pg_url, 101, 105)) == [101, 102, 103, 104, 105]


async def test_past_its_bound_a_blocked_key_dead_letters_its_records_in_order(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_tables(pg_url, poison=[3])
    await create_topic(kafka_bootstrap, topic)
    await produce_events(kafka_bootstrap, topic, interleaved())
    app = sequence_app(topic, max_held_per_key=3, on_hold_full="dead-letter")
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or (runtime.stats.held, runtime.stats.dead_lettered),
            lambda seen: seen == (3, 5),
            DEADLINE_S,
            "3 held, then 7..10 dead-lettered after 3",
        )
        letters = await cli("dlq", "list", f"{topic}.dlq", "--bootstrap", kafka_bootstrap, "--json")
        assert letters.code == 0, letters.err
        listed = letters.json()["records"]
        assert [r["id"] for r in listed] == ["w-3", "w-7", "w-8", "w-9", "w-10"]
        assert [r["error_class"] for r in listed[1:]] == ["permanent:HeldQueueFullError"] * 4
    assert applied(pg_url, 1, 10) == [1, 2]
    assert count_rows(pg_url, consumer_held_events) == 3


async def test_past_its_bound_a_blocked_key_makes_its_partition_wait(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_tables(pg_url, poison=[3])
    await create_topic(kafka_bootstrap, topic)
    await produce_events(kafka_bootstrap, topic, interleaved())
    app = sequence_app(topic, max_held_per_key=3)  # on_hold_full="stop"
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or committed_offsets(kafka_bootstrap, runtime.group),
            lambda offsets: offsets.get(TopicPartition(topic, 0)) == 11,
            DEADLINE_S,
            "the partition committed up to K's 7, which waits",
        )
        assert runtime.stats.held == 3 and runtime.stats.dead_lettered == 1
        skipped = await cli(
            "dlq", "sequences", "skip", "--consumer", "billing", "--topic", topic, "--key", "K",
            "--reason", "given up", "--db-url", pg_url,
        )  # fmt: skip
        assert skipped.code == 0, skipped.err
        await wait_for(
            lambda: alive(task) or applied_now(pg_url, 1, 10),
            lambda ns: ns == [1, 2, 4, 5, 6, 7, 8, 9, 10],
            DEADLINE_S,
            "4..10 in order once there is room",
        )
    assert await rows(pg_url, consumer_sequences) == 0
