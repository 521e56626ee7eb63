"""Availability under poison input, stuck handlers and signals (real Kafka and PostgreSQL).

Each test reproduces a way the consumer used to stop for good or stall: a dead letter too large
for the broker, a retrying partition holding up the others, a handler that never returns,
SIGTERM while starting up or with a handler stuck, JSON nested too deeply for the parser.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from cloudevents.core.v1.event import CloudEvent
from outboxkit.cli.errors import EXIT_STOPPED_STUCK
from outboxkit.consumers import ConsumerApp, dlq_headers
from outboxkit.outbox import RetryPolicy, TransientError
from outboxkit.outbox.backoff import Backoff
from outboxkit.testing.kafka import KafkaBroker, create_topic
from outboxkit.testing.processes import start_cli, terminate
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from tests.support.consumer_apps import WIDGET_TYPE, Widget, consumer_effects
from tests.support.consumers import (
    FAST_RETRY,
    alive,
    binary_record,
    committed_offsets,
    create_effects_table,
    effect_rows,
    effects_app_for,
    produce,
    running,
    widget,
)
from tests.support.kafka import read_topic, wait_for

# The broker's default message.max.bytes is 1,048,588: a record this big fits, but not once the
# dead-letter headers (about 400 bytes) are added to it.
NEAR_LIMIT = 1_048_000


def texts(record) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return dlq_headers.header_texts(record.headers)


async def insert_effect(session: AsyncSession, event: CloudEvent, n: int) -> None:
    await session.execute(
        insert(consumer_effects).values(
            consumer="billing", source=event.get_source(), event_id=event.get_id(), n=n, pid=0
        )
    )


async def test_an_invalid_record_near_the_size_limit_is_dead_lettered_truncated(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    key, _, headers = binary_record(widget(1))
    poison = b"{" + b"x" * (NEAR_LIMIT - 1)  # invalid JSON of about 1,048,000 bytes
    await produce(kafka_bootstrap, topic, [(key, poison, headers), binary_record(widget(2))])
    app = effects_app_for(topic, retry=FAST_RETRY)
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: committed_offsets(kafka_bootstrap, runtime.group),
            lambda offsets: alive(task) or offsets.get(TopicPartition(topic, 0)) == 2,
            30,
            "both records done and committed",
        )
    assert [row.n for row in effect_rows(pg_url)] == [2]
    assert runtime.stats.dead_lettered == 1
    (letter,) = await read_topic(kafka_bootstrap, f"{topic}.dlq", expected=1, timeout=30)
    facts = texts(letter)
    assert facts[dlq_headers.TRUNCATED] == "value"
    assert facts[dlq_headers.ORIGINAL_SIZE] == str(NEAR_LIMIT)
    assert facts[dlq_headers.ERROR_CLASS] == "permanent:InvalidJSONError"
    assert facts[dlq_headers.ORIGINAL_OFFSET] == "0" and facts["ce_id"] == "w-1"
    assert letter.value == poison[: len(letter.value)] and len(letter.value) < NEAR_LIMIT // 10


async def test_a_retrying_partition_does_not_delay_the_others(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic, partitions=2)
    slow_retry = RetryPolicy(
        max_attempts=1000, backoff=Backoff(base_s=0.2, cap_s=0.2), max_elapsed_s=300
    )
    app = ConsumerApp(name="billing", retry=slow_retry, retention_interval_s=None)
    release = asyncio.Event()

    @app.handler(WIDGET_TYPE, topic=topic)
    async def record(item: Widget, event: CloudEvent, session: AsyncSession) -> None:
        if item.n == 1 and not release.is_set():
            raise TransientError("stock service busy")
        await insert_effect(session, event, item.n)

    await produce(kafka_bootstrap, topic, [binary_record(widget(1))], partition=0)
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.retries, lambda n: n >= 2, 60, "retrying on 0"
        )
        await produce(kafka_bootstrap, topic, [binary_record(widget(2))], partition=1)
        await wait_for(
            lambda: alive(task) or [row.n for row in effect_rows(pg_url)],
            lambda rows: rows == [2],
            15,
            "the record of partition 1 applied",
        )
        retries = runtime.stats.retries
        await wait_for(
            lambda: runtime.stats.retries, lambda n: n > retries, 10, "partition 0 still retrying"
        )
        assert [row.n for row in effect_rows(pg_url)] == [2]  # 1 is still being retried
        release.set()
        await wait_for(lambda: alive(task) or runtime.stats.applied, lambda n: n == 2, 30, "1")
    assert sorted(row.n for row in effect_rows(pg_url)) == [1, 2]


async def test_a_handler_that_never_returns_is_timed_out_and_retried(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    app = ConsumerApp(name="billing", retry=FAST_RETRY, retention_interval_s=None)
    hung: list[int] = []

    @app.handler(WIDGET_TYPE, topic=topic, timeout_s=1.0)  # the app's default is minutes
    async def record(item: Widget, event: CloudEvent, session: AsyncSession) -> None:
        if item.n == 1 and not hung:
            hung.append(item.n)
            await asyncio.Event().wait()  # never returns
        await insert_effect(session, event, item.n)

    await produce(kafka_bootstrap, topic, [binary_record(widget(n)) for n in (1, 2)])
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(lambda: alive(task) or runtime.stats.applied, lambda n: n == 2, 30, "both")
    assert hung == [1]
    assert [row.n for row in effect_rows(pg_url)] == [1, 2]
    assert runtime.stats.retries == 1 and runtime.stats.dead_lettered == 0


async def test_a_handler_timing_out_every_time_is_dead_lettered_as_exhausted(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    app = ConsumerApp(
        name="billing", retry=FAST_RETRY, retention_interval_s=None, handler_timeout_s=0.3
    )

    @app.handler(WIDGET_TYPE, topic=topic)
    async def record(item: Widget, event: CloudEvent, session: AsyncSession) -> None:
        if item.n == 1:
            await asyncio.sleep(3600)
        await insert_effect(session, event, item.n)

    await produce(kafka_bootstrap, topic, [binary_record(widget(n)) for n in (1, 2)])
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied + runtime.stats.dead_lettered,
            lambda n: n == 2,
            30,
            "both done",
        )
    (letter,) = await read_topic(kafka_bootstrap, f"{topic}.dlq", expected=1, timeout=30)
    facts = texts(letter)
    assert facts[dlq_headers.ERROR_CLASS] == "exhausted:HandlerTimeoutError"
    assert (
        facts[dlq_headers.ATTEMPTS] == "3"
        and "did not return within 0.3 s" in facts[dlq_headers.ERROR_MESSAGE]
    )
    assert [row.n for row in effect_rows(pg_url)] == [2]


async def test_json_nested_too_deeply_is_dead_lettered_at_once(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    deep = b"[" * 100_000 + b"]" * 100_000
    key, _, headers = binary_record(widget(1))
    envelope = b'{"specversion": "1.0", "id": "s-1", "source": "/s", "type": "widget.created", '
    structured = (
        b"k",
        envelope + b'"data": ' + deep + b"}",
        [("content-type", b"application/cloudevents+json")],
    )
    await produce(
        kafka_bootstrap, topic, [(key, deep, headers), structured, binary_record(widget(3))]
    )
    async with running(effects_app_for(topic, retry=FAST_RETRY), pg_url, kafka_bootstrap) as (
        runtime,
        task,
    ):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied + runtime.stats.dead_lettered,
            lambda n: n == 3,
            30,
            "all three done",
        )
    assert runtime.stats.retries == 0 and runtime.stats.dead_lettered == 2
    letters = await read_topic(kafka_bootstrap, f"{topic}.dlq", expected=2, timeout=30)
    assert [texts(r)[dlq_headers.ERROR_CLASS] for r in letters] == [
        "permanent:InvalidJSONError"
    ] * 2
    assert [texts(r)[dlq_headers.ATTEMPTS] for r in letters] == ["1", "1"]
    assert [row.n for row in effect_rows(pg_url)] == [3]


def consume_args(target: str, db_url: str, bootstrap: str, *extra: str) -> list[str]:
    group = f"avail-{uuid.uuid4().hex[:8]}"
    return [
        "consume",
        target,
        "--db-url",
        db_url,
        "--bootstrap",
        bootstrap,
        "--group",
        group,
        *extra,
    ]


async def wait_for_line(process: subprocess.Popen[bytes], log: Path, pattern: str) -> str:
    def read() -> str:
        if process.poll() is not None:
            raise AssertionError(f"exited {process.returncode}: {log.read_text()}")
        return log.read_text() if log.exists() else ""

    return await wait_for(read, lambda text: re.search(pattern, text) is not None, 60, pattern)


async def test_sigterm_while_starting_up_exits_0(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    log = tmp_path / "consume.log"
    args = consume_args("tests.support.slow_consumer_app:app", pg_url, kafka_bootstrap)
    process = start_cli(args, log, env={"OUTBOXKIT_TEST_TOPIC": topic})
    try:
        await wait_for_line(process, log, "importing slow app")
        process.send_signal(signal.SIGTERM)  # while the app is still being imported
        code = await asyncio.to_thread(process.wait, 30)
    finally:
        terminate(process)
    text = log.read_text()
    assert code == 0, text
    assert "not started" in text and "consumer effects started" not in text


@pytest.mark.parametrize("target", ["hanging_app", "hanging_thread_app"])
async def test_sigterm_with_a_stuck_handler_exits_4_naming_it(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path, target: str
) -> None:
    await create_topic(kafka_bootstrap, topic)
    await produce(kafka_bootstrap, topic, [binary_record(widget(7))])
    log = tmp_path / "consume.log"
    args = consume_args(
        f"tests.support.consumer_apps:{target}", pg_url, kafka_bootstrap, "--stop-timeout", "1"
    )
    process = start_cli(args, log, env={"OUTBOXKIT_TEST_TOPIC": topic})
    try:
        await wait_for_line(process, log, r"consumer hanging(-thread)? started")
        await wait_for_line(process, log, "handler entered: widget 7")
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 30)
    finally:
        terminate(process)
    text = log.read_text()
    assert code == EXIT_STOPPED_STUCK, text
    stuck = re.search(r"stop deadline passed: widget.created handler \S+ on (\S+)", text)
    assert stuck is not None, text
    assert stuck.group(1) == f"{topic}[0]@0"


@pytest.mark.timeout(240)
async def test_a_consumer_started_while_the_broker_is_down_waits_then_applies(
    pg_url: str, own_kafka: KafkaBroker, topic: str, tmp_path: Path
) -> None:
    """A long-running consumer retries its start with backoff, logging the cause once, instead
    of exiting; once the broker is back it applies every event once."""
    create_effects_table(pg_url)
    await create_topic(own_kafka.bootstrap, topic, partitions=2)
    await produce(own_kafka.bootstrap, topic, [binary_record(widget(n)) for n in range(20)])
    own_kafka.stop()
    log = tmp_path / "consume.log"
    args = consume_args("tests.support.consumer_apps:effects_app", pg_url, own_kafka.bootstrap)
    process = start_cli(args, log, env={"OUTBOXKIT_TEST_TOPIC": topic})
    try:
        await wait_for_line(process, log, r"kafka or database unavailable: .*; retrying")
        own_kafka.start()
        await wait_for(lambda: len(effect_rows(pg_url)), lambda n: n >= 20, 120, "20 effects")
        await wait_for_line(process, log, "consumer effects started")
    finally:
        code = terminate(process)
    text = log.read_text()
    assert code == 0, text
    assert sorted(row.n for row in effect_rows(pg_url)) == list(range(20))
    causes = re.findall(r"kafka or database unavailable: (.*); retrying", text)
    assert len(causes) == len(set(causes)) <= 2, causes  # one line per cause, not per attempt
    assert "available again after" in text
