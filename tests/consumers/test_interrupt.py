"""A handler raising KeyboardInterrupt or SystemExit stops ``outboxkit consume`` at once, with
exit code 5, its record logged (no payload) and its offset not committed: a restarted consumer
applies it. A real process, a real broker and PostgreSQL."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from outboxkit.cli.errors import EXIT_HANDLER_INTERRUPTED
from outboxkit.testing.kafka import create_topic
from outboxkit.testing.processes import start_cli, terminate

from tests.support.consumers import (
    binary_record,
    committed_offsets,
    create_effects_table,
    effect_rows,
    produce,
    widget,
)
from tests.support.kafka import wait_for


def consume(app: str, db_url: str, bootstrap: str, group: str) -> list[str]:
    target = f"tests.support.consumer_apps:{app}"
    return ["consume", target, "--db-url", db_url, "--bootstrap", bootstrap, "--group", group]


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "SystemExit"])
async def test_a_handler_interrupt_exits_5_without_committing_its_offset(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path, raised: str
) -> None:
    # Before: the partition stalled silently, and SIGTERM then took 21-26 s and exited 130.
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    await produce(kafka_bootstrap, topic, [binary_record(widget(n)) for n in (1, 2, 3)])
    group = f"interrupt-{uuid.uuid4().hex[:8]}"
    env = {"OUTBOXKIT_TEST_TOPIC": topic, "OUTBOXKIT_TEST_INTERRUPT": raised}
    log = tmp_path / "consume.log"
    process = start_cli(consume("interrupting_app", pg_url, kafka_bootstrap, group), log, env=env)
    line = f"raised {raised} on widget.created {topic}[0]@1"
    try:
        await wait_for(
            lambda: log.read_text() if log.exists() else "", lambda t: line in t, 180, line
        )
        raised_at = time.monotonic()
        code = await asyncio.to_thread(process.wait, 60)
        took = time.monotonic() - raised_at
    finally:
        terminate(process)
    text = log.read_text()
    assert code == EXIT_HANDLER_INTERRUPTED, text
    print(f"exited {code} {took:.2f} s after the handler raised")
    assert took < 20, took
    assert "Traceback" not in text, text
    # nothing at or past widget 2 (offset 1) is applied or committed; widget 1 is, or it was
    # rolled back with widget 2 when both were in one transaction
    assert [row.n for row in effect_rows(pg_url)] in ([], [1])
    assert (await committed_offsets(kafka_bootstrap, group)).get(TopicPartition(topic, 0), 0) <= 1

    restarted = start_cli(consume("effects_app", pg_url, kafka_bootstrap, group), log, env=env)
    try:
        await wait_for(lambda: len(effect_rows(pg_url)), lambda n: n >= 3, 180, "three effects")
        restarted.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(restarted.wait, 60) == 0
    finally:
        terminate(restarted)
    assert sorted(row.n for row in effect_rows(pg_url)) == [1, 2, 3]
