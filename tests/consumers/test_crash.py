"""A consumer process killed between its database commit and its offset commit, then restarted.

The crash point is deterministic: the first process (:mod:`tests.support.crashing_consumer`)
passes the runtime an ``on_db_commit`` hook that SIGKILLs it right after its first database
commit, before any offset is committed, and fetches at most ``CRASH_BATCH`` records at once, so
that commit (with any other partition's commit already under way) covers only some events.
"""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

import pytest
from outboxkit.cli.main import main
from outboxkit.outbox import new_event
from outboxkit.testing.kafka import create_topic
from outboxkit.testing.processes import start_cli, terminate

from tests.support import crashing_consumer
from tests.support.consumer_apps import WIDGET_TYPE
from tests.support.consumers import (
    committed_offsets,
    create_effects_table,
    effect_rows,
    produce_events,
)
from tests.support.kafka import wait_for

EVENTS = 300
CRASH_BATCH = 50
PARTITIONS = 3


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
    await create_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
    events = [
        new_event(WIDGET_TYPE, "/widgets", {"n": n}, id=f"w-{n}", partitionkey=f"k{n % 11}")
        for n in range(EVENTS)
    ]
    await produce_events(kafka_bootstrap, topic, events)
    group = f"crash-{topic}"
    args = consume_args(pg_url, kafka_bootstrap, group)
    env = {"OUTBOXKIT_TEST_TOPIC": topic}

    crashing = crashing_consumer.start(
        pg_url,
        kafka_bootstrap,
        group,
        after=1,
        max_batch=CRASH_BATCH,
        topic=topic,
        log=tmp_path / "first.log",
    )
    try:
        code = await asyncio.to_thread(crashing.wait, 90)
    finally:
        terminate(crashing)
    assert code == -signal.SIGKILL, (tmp_path / "first.log").read_text()
    applied = len(effect_rows(pg_url))
    committed = sum((await committed_offsets(kafka_bootstrap, group)).values())
    # Effects of the first commit are in the database, with those of any other partition's
    # commit already sent (at most one chunk per partition); not one offset reached Kafka.
    assert committed == 0 and 0 < applied <= CRASH_BATCH * PARTITIONS

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
    assert int(stopped.group(1)) == applied


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("tests.no_such_module:app", "cannot import module 'tests.no_such_module'"),
        ("tests.support.consumer_apps:not_an_app", "is a str, not an outboxkit ConsumerApp"),
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
