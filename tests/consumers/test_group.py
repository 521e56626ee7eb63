"""Several consumer processes in one group, one joining mid-stream: every effect exactly once."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from outboxkit.outbox import new_event
from outboxkit.testing.kafka import create_topic
from outboxkit.testing.processes import start_cli, terminate

from tests.support.consumer_apps import WIDGET_TYPE
from tests.support.consumers import (
    committed_offsets,
    create_effects_table,
    effect_rows,
    produce_events,
)
from tests.support.kafka import wait_for

EVENTS = 5_000
PARTITIONS = 6


async def test_three_processes_one_joining_mid_stream_apply_5000_events_once(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
    events = [
        new_event(WIDGET_TYPE, "/widgets", {"n": n}, id=f"w-{n}", partitionkey=f"key-{n}")
        for n in range(EVENTS)
    ]
    group = f"group-{topic}"
    args = [
        "consume",
        "tests.support.consumer_apps:effects_app",
        "--db-url",
        pg_url,
        "--bootstrap",
        kafka_bootstrap,
        "--group",
        group,
    ]
    # A millisecond per event keeps the first members busy while the third one joins.
    env = {"OUTBOXKIT_TEST_TOPIC": topic, "OUTBOXKIT_TEST_HANDLER_DELAY_MS": "1"}
    logs = [tmp_path / f"consumer-{i}.log" for i in range(3)]
    await produce_events(kafka_bootstrap, topic, events[: EVENTS // 2])
    processes = [start_cli(args, logs[0], env), start_cli(args, logs[1], env)]
    try:
        await wait_for(lambda: len(effect_rows(pg_url)), lambda n: n >= 500, 90, "first effects")
        processes.append(start_cli(args, logs[2], env))
        assigned = re.compile(rf"partitions assigned: {re.escape(topic)}\[")
        await wait_for(
            lambda: logs[2].read_text() if logs[2].exists() else "",
            lambda text: assigned.search(text) is not None,
            90,
            "the third member's assignment",
        )
        await produce_events(kafka_bootstrap, topic, events[EVENTS // 2 :])
        await wait_for(lambda: len(effect_rows(pg_url)), lambda n: n >= EVENTS, 120, "effects")
        await wait_for(
            lambda: committed_offsets(kafka_bootstrap, group),
            lambda offsets: sum(offsets.values()) == EVENTS,
            60,
            "every offset committed",
        )
    finally:
        codes = await asyncio.gather(*(asyncio.to_thread(terminate, p) for p in processes))
    assert codes == [0] * len(processes), [log.read_text()[-2000:] for log in logs]
    rows = effect_rows(pg_url)
    assert len(rows) == EVENTS
    assert {row.event_id for row in rows} == {f"w-{n}" for n in range(EVENTS)}
    assert len({row.pid for row in rows}) == 3  # the late member took its share
