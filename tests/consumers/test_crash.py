"""A consumer process killed between its database commit and its offset commit, then restarted.

The crash point is made deterministic by the runtime's test-only hook: with
``OUTBOXKIT_TEST_CRASH_AFTER_COMMIT=N`` the process SIGKILLs itself right after its Nth database
commit, before committing the matching Kafka offsets (see ``consumers/runtime.py``).
"""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

import pytest
from outboxkit.cli.main import main
from outboxkit.consumers.runtime import CRASH_AFTER_COMMIT_ENV
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

EVENTS = 300


def consume_args(db_url: str, bootstrap: str, group: str) -> list[str]:
    return [
        "consume",
        "tests.support.consumer_apps:effects_app",
        "--db-url",
        db_url,
        "--bootstrap",
        bootstrap,
        "--group",
        group,
    ]


async def test_redelivery_after_a_crash_between_db_commit_and_offset_commit_is_skipped(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic, partitions=3)
    events = [
        new_event(WIDGET_TYPE, "/widgets", {"n": n}, id=f"w-{n}", partitionkey=f"k{n % 11}")
        for n in range(EVENTS)
    ]
    await produce_events(kafka_bootstrap, topic, events)
    group = f"crash-{topic}"
    args = consume_args(pg_url, kafka_bootstrap, group)
    env = {"OUTBOXKIT_TEST_TOPIC": topic}

    crashing = start_cli(args, tmp_path / "first.log", env={**env, CRASH_AFTER_COMMIT_ENV: "2"})
    try:
        code = await asyncio.to_thread(crashing.wait, 90)
    finally:
        terminate(crashing)
    assert code == -signal.SIGKILL, (tmp_path / "first.log").read_text()
    applied = len(effect_rows(pg_url))
    committed = sum((await committed_offsets(kafka_bootstrap, group)).values())
    # The second database commit has effects whose offsets were never committed.
    assert committed < applied < EVENTS

    restarted = start_cli(args, tmp_path / "second.log", env=env)
    try:
        await wait_for(lambda: len(effect_rows(pg_url)), lambda n: n >= EVENTS, 90, "all effects")
        await wait_for(
            lambda: committed_offsets(kafka_bootstrap, group),
            lambda offsets: sum(offsets.values()) == EVENTS,
            60,
            "every offset committed",
        )
    finally:
        code = await asyncio.to_thread(terminate, restarted)
    log = (tmp_path / "second.log").read_text()
    assert code == 0, log
    rows = effect_rows(pg_url)
    assert len(rows) == EVENTS
    assert {row.event_id for row in rows} == {f"w-{n}" for n in range(EVENTS)}
    stopped = re.search(r"stopped: .*duplicates=(\d+)", log)
    assert stopped is not None, log
    # Exactly the records applied but not committed before the crash came back, and were skipped.
    assert int(stopped.group(1)) == applied - committed


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("tests.no_such_module:app", "cannot import module 'tests.no_such_module'"),
        ("tests.support.consumer_apps:not_an_app", "is a str, not a consumers.ConsumerApp"),
        ("tests.support.consumer_apps:missing", "has no attribute 'missing'"),
        ("tests.support.consumer_apps", "expected MODULE:APP"),
    ],
)
def test_consume_rejects_a_bad_target_in_one_line(
    target: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["consume", target, "--bootstrap", "127.0.0.1:1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
