"""Failures: retries, dead letters with their headers, an unreachable DLQ, malformed records."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from aiokafka import TopicPartition
from cloudevents.core.v1.event import CloudEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from outboxkit.consumers import ConsumerApp, dlq_headers
from outboxkit.outbox import PermanentError, RetryPolicy, TransientError
from outboxkit.outbox.backoff import Backoff
from outboxkit.testing.kafka import create_topic
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncSession

from tests.support.consumer_apps import WIDGET_TYPE, Widget, consumer_effects
from tests.support.consumers import (
    FAST_RETRY,
    alive,
    binary_record,
    committed_offsets,
    create_effects_table,
    effect_rows,
    produce,
    running,
    widget,
)
from tests.support.kafka import read_topic, wait_for


class OrderRejected(PermanentError):
    """A business rule refuses the event for good."""


def failing_app(topic: str, fail: dict[int, list[BaseException]], **options: object) -> ConsumerApp:
    """Writes an effect row, then raises the next error queued for the widget's ``n``.

    Raising after the write proves that a failed attempt rolls back the handler's work.
    """
    app = ConsumerApp(name="billing", retry=FAST_RETRY, retention_interval_s=None, **options)  # type: ignore[arg-type]

    @app.handler(WIDGET_TYPE, topic=topic)
    async def record(widget: Widget, event: CloudEvent, session: AsyncSession) -> None:
        await session.execute(
            insert(consumer_effects).values(
                consumer="billing",
                source=event.get_source(),
                event_id=event.get_id(),
                n=widget.n,
                pid=0,
            )
        )
        queued = fail.get(widget.n)
        if queued:
            raise queued.pop(0)

    return app


def headers_of(record) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {name: (value or b"").decode("utf-8", "replace") for name, value in record.headers}


async def test_transient_failures_are_retried_and_applied_once(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    fail: dict[int, list[BaseException]] = {
        2: [TransientError("stock service busy"), TimeoutError()]
    }
    await produce(kafka_bootstrap, topic, [binary_record(widget(n)) for n in (1, 2, 3)])
    async with running(failing_app(topic, fail), pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied, lambda n: n >= 3, 60, "3 effects"
        )
    assert [row.n for row in effect_rows(pg_url)] == [1, 2, 3]  # once each, in partition order
    assert runtime.stats.retries == 2 and runtime.stats.dead_lettered == 0
    committed = await committed_offsets(kafka_bootstrap, runtime.group)
    assert committed == {TopicPartition(topic, 0): 3}


async def test_a_lost_database_connection_is_retried_without_losing_or_doubling(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    app = ConsumerApp(name="billing", retry=FAST_RETRY, retention_interval_s=None)
    killed: list[int] = []

    @app.handler(WIDGET_TYPE, topic=topic)
    async def record(widget: Widget, event: CloudEvent, session: AsyncSession) -> None:
        await session.execute(
            insert(consumer_effects).values(
                consumer="billing", source="/w", event_id=event.get_id(), n=widget.n, pid=0
            )
        )
        if widget.n == 2 and not killed:
            killed.append(widget.n)  # the server ends this very connection mid-transaction
            await session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))

    await produce(kafka_bootstrap, topic, [binary_record(widget(n)) for n in (1, 2, 3)])
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied, lambda n: n >= 3, 60, "3 effects"
        )
    assert killed == [2]
    assert [row.n for row in effect_rows(pg_url)] == [1, 2, 3]
    assert runtime.stats.retries >= 1 and runtime.stats.dead_lettered == 0


async def test_exhausted_retries_and_permanent_failures_are_dead_lettered_with_headers(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    fail: dict[int, list[BaseException]] = {
        2: [OrderRejected("order total exceeds the credit limit")],
        3: [KeyError("secret-customer-email@example.com") for _ in range(5)],
    }
    records = [binary_record(widget(n)) for n in (1, 2, 3, 4)]
    records[1] = (records[1][0], records[1][1], [*records[1][2], ("traceparent", b"00-abc-01")])
    await produce(kafka_bootstrap, topic, records)
    started_ms = int(time.time() * 1000)
    async with running(failing_app(topic, fail), pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied + runtime.stats.dead_lettered,
            lambda n: n >= 4,
            60,
            "all four records",
        )
        await wait_for(
            lambda: committed_offsets(kafka_bootstrap, runtime.group),
            lambda c: c.get(TopicPartition(topic, 0)) == 4,
            30,
            "offsets committed past the dead letters",
        )
    assert [row.n for row in effect_rows(pg_url)] == [1, 4]  # failed attempts rolled back
    letters = await read_topic(kafka_bootstrap, f"{topic}.dlq", expected=2, timeout=30)
    assert len(letters) == 2
    by_offset = {int(headers_of(r)[dlq_headers.ORIGINAL_OFFSET]): r for r in letters}
    rejected, exhausted = by_offset[1], by_offset[2]
    for letter, (key, value, original_headers) in ((rejected, records[1]), (exhausted, records[2])):
        assert letter.key == key and letter.value == value
        assert list(letter.headers)[: len(original_headers)] == list(original_headers)
        facts = headers_of(letter)
        assert set(dlq_headers.ALL) <= set(facts)
        assert facts[dlq_headers.ORIGINAL_TOPIC] == topic
        assert facts[dlq_headers.ORIGINAL_PARTITION] == "0"
        assert facts[dlq_headers.CONSUMER_GROUP] == runtime.group
        first, last = (
            int(facts[dlq_headers.FIRST_FAILURE_MS]),
            int(facts[dlq_headers.LAST_FAILURE_MS]),
        )
        assert started_ms - 5000 <= first <= last <= int(time.time() * 1000)
        assert int(facts[dlq_headers.ORIGINAL_TIMESTAMP]) > 0
    rejected_facts, exhausted_facts = headers_of(rejected), headers_of(exhausted)
    assert rejected_facts[dlq_headers.ERROR_CLASS] == "permanent:OrderRejected"
    assert rejected_facts[dlq_headers.ERROR_MESSAGE] == "order total exceeds the credit limit"
    assert rejected_facts[dlq_headers.ATTEMPTS] == "1"
    assert exhausted_facts[dlq_headers.ERROR_CLASS] == "exhausted:KeyError"
    assert exhausted_facts[dlq_headers.ATTEMPTS] == str(FAST_RETRY.max_attempts)
    assert "secret" not in exhausted_facts[dlq_headers.ERROR_MESSAGE]


async def test_unreachable_dead_letter_topic_blocks_the_offset_commit(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    fail: dict[int, list[BaseException]] = {2: [OrderRejected("refused")]}
    await produce(kafka_bootstrap, topic, [binary_record(widget(n)) for n in (1, 2, 3)])
    app = failing_app(
        topic,
        fail,
        dlq_topic="{topic}." + "x" * 250,  # longer than Kafka allows: the broker refuses it
        dlq_timeout_s=1.0,
        dlq_retry=RetryPolicy(max_attempts=10**6, backoff=Backoff(base_s=0.05, cap_s=0.2)),
    )
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.dlq_failures, lambda n: n >= 2, 60, "DLQ failures"
        )
        committed = await committed_offsets(kafka_bootstrap, runtime.group)
        assert committed.get(TopicPartition(topic, 0), 0) <= 1  # never past the failed record
        assert not task.done()
    committed = await committed_offsets(kafka_bootstrap, runtime.group)
    assert committed.get(TopicPartition(topic, 0), 0) <= 1
    assert runtime.stats.dead_lettered == 0


def malformed_records() -> list[tuple[str, tuple[bytes | None, bytes | None, list]]]:
    """Hand-made records no handler may see, with the error class each must be filed under."""
    good_key, good_value, good_headers = binary_record(widget(99))
    ce = dict(good_headers)

    def with_headers(**changes: bytes | None) -> list[tuple[str, bytes]]:
        merged = {**ce, **changes}
        return [(k, v) for k, v in merged.items() if v is not None]

    structured = (
        b'{"specversion":"1.0","id":"s-1","source":"/s","type":"widget.created","data":{"n":1}}'
    )
    return [
        ("permanent:NotACloudEventError", (None, b"plain text, no headers", [])),
        ("permanent:InvalidJSONError", (good_key, b'{"n": 1', with_headers())),
        (
            "permanent:MissingAttributesError",
            (None, good_value, with_headers(ce_id=None, ce_source=None)),
        ),
        ("permanent:ValidationError", (good_key, b'{"n": "not a number"}', with_headers())),
        ("permanent:ValidationError", (good_key, b"", with_headers())),
        ("permanent:InvalidAttributeError", (None, good_value, with_headers(ce_type=b"\xff\xfe"))),
        ("permanent:InvalidAttributeError", (None, good_value, with_headers(ce_time=b"yesterday"))),
        (
            "permanent:InvalidAttributeError",
            (None, good_value, with_headers(ce_specversion=b"0.1")),
        ),
        ("permanent:NoHandlerError", (None, good_value, with_headers(ce_type=b"gadget.created"))),
        (
            "permanent:InvalidJSONError",
            (None, b"{not json", [("content-type", b"application/cloudevents+json")]),
        ),
        (
            "permanent:MissingAttributesError",
            (
                None,
                structured.replace(b'"id":"s-1",', b""),
                [("content-type", b"application/cloudevents+json")],
            ),
        ),
        (
            "permanent:UnsupportedFormatError",
            (None, structured, [("content-type", b"application/cloudevents+avro")]),
        ),
    ]


def garbage_header_sets() -> list[list[tuple[str, bytes | None]]]:
    """Small random header lists mixing CloudEvents names with junk (hypothesis, 25 examples)."""
    names = st.sampled_from(
        [
            "ce_id",
            "ce_source",
            "ce_type",
            "ce_specversion",
            "ce_time",
            "content-type",
            "ce_Bad-Name",
        ]
    ) | st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=10)
    values = (
        st.none()
        | st.binary(max_size=12)
        | st.sampled_from(
            [
                b"1.0",
                b"/src",
                b"widget.created",
                b"application/json",
                b"application/cloudevents+json",
            ]
        )
    )
    found: list[list[tuple[str, bytes | None]]] = []

    @settings(
        max_examples=25, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(st.lists(st.tuples(names, values), max_size=6))
    def collect(headers: list[tuple[str, bytes | None]]) -> None:
        found.append(headers)

    collect()
    return found


async def test_malformed_records_are_dead_lettered_and_the_consumer_keeps_going(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    crafted = malformed_records()
    garbage = garbage_header_sets()
    # The value is never valid widget data, so no garbage record may reach the handler.
    records = [record for _, record in crafted] + [(None, b"\x00garbage", h) for h in garbage]
    records.append(binary_record(widget(1)))  # after all the bad ones: must still be applied
    await produce(kafka_bootstrap, topic, records)
    app = failing_app(topic, {}, unhandled="dead-letter")
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied, lambda n: n >= 1, 60, "good one"
        )
        assert not task.done()
    bad = len(records) - 1
    assert runtime.stats.dead_lettered == bad
    assert [row.n for row in effect_rows(pg_url)] == [1]
    letters = await read_topic(kafka_bootstrap, f"{topic}.dlq", expected=bad, timeout=30)
    assert len(letters) == bad
    classes = {int(headers_of(r)[dlq_headers.ORIGINAL_OFFSET]): headers_of(r) for r in letters}
    for offset, (expected_class, (_, value, _)) in enumerate(crafted):
        facts = classes[offset]
        assert facts[dlq_headers.ERROR_CLASS] == expected_class, facts[dlq_headers.ERROR_MESSAGE]
        if value and len(value) > 4:
            assert value.decode("utf-8", "replace") not in facts[dlq_headers.ERROR_MESSAGE]
    garbage_classes = Counter(
        classes[offset][dlq_headers.ERROR_CLASS].split(":")[0]
        for offset in range(len(crafted), bad)
    )
    assert garbage_classes == {"permanent": len(garbage)}


async def test_stop_abandons_a_record_waiting_to_be_retried(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    slow = RetryPolicy(max_attempts=100, backoff=Backoff(base_s=30, cap_s=30), max_elapsed_s=300)
    queued: list[BaseException] = [TransientError("busy") for _ in range(100)]
    app = failing_app(topic, {1: queued})
    app.retry = slow
    await produce(kafka_bootstrap, topic, [binary_record(widget(1))])
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        # The first attempt failed: the record now waits up to 30 s for its retry.
        await wait_for(lambda: alive(task) or len(queued), lambda n: n == 99, 60, "1st attempt")
        begun = time.monotonic()
    assert time.monotonic() - begun < 10  # the stop cut the backoff short
    assert runtime.stats.applied == 0 and effect_rows(pg_url) == []
    assert await committed_offsets(kafka_bootstrap, runtime.group) == {}


async def test_a_record_waiting_behind_a_slow_retry_gets_its_own_retry_budget(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    """Widget 2 fails once; the records before it go again without it, and widget 1 then
    takes longer than the whole retry budget (a database failing over): widget 2's budget
    starts when its retry does, so it is retried and applied, not dead-lettered unretried."""
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    budget = RetryPolicy(max_attempts=5, backoff=Backoff(base_s=0.01, cap_s=0.05), max_elapsed_s=1)
    app = ConsumerApp(name="billing", retry=budget, retention_interval_s=None)
    calls: Counter[int] = Counter()

    @app.handler(WIDGET_TYPE, topic=topic)
    async def record(widget: Widget, event: CloudEvent, session: AsyncSession) -> None:
        calls[widget.n] += 1
        await session.execute(
            insert(consumer_effects).values(
                consumer="billing", source="/w", event_id=event.get_id(), n=widget.n, pid=0
            )
        )
        if widget.n == 2 and calls[2] == 1:
            raise TransientError("stock service busy")
        if widget.n == 1 and calls[1] == 2:  # its run again without widget 2: a slow outage
            await asyncio.sleep(1.5)
            raise TransientError("database failing over")

    await produce(kafka_bootstrap, topic, [binary_record(widget(n)) for n in (1, 2, 3)])
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied + runtime.stats.dead_lettered,
            lambda n: n >= 3,
            60,
            "3 records done",
        )
    assert runtime.stats.dead_lettered == 0
    assert [row.n for row in effect_rows(pg_url)] == [1, 2, 3]
