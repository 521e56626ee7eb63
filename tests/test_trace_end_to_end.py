"""One trace from the writing transaction through the relay to the handler, and what the consumer
span says about retries, dead letters, rollbacks and duplicates. Real Kafka and PostgreSQL."""

from __future__ import annotations

from typing import Any

from aiokafka import ConsumerRecord
from cloudevents.core.v1.event import CloudEvent
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from outboxkit.actions.events import STARTED
from outboxkit.consumers import ConsumerApp
from outboxkit.consumers.tracing import HandlerTelemetry
from outboxkit.outbox import Outbox, PermanentError, TransientError, new_event, telemetry
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay, RelayOptions
from outboxkit.testing.kafka import create_topic
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from tests.support.consumers import FAST_RETRY, alive, binary_record, produce, running
from tests.support.kafka import read_topic, wait_for
from tests.support.waits import scaled

MARKER = "MARKER-5e1f-never-in-a-span"
RELAY_OPTIONS = RelayOptions(lease_ttl_s=5.0, request_timeout_s=2.0, retention_s=3600)


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    """Finished spans called ``name``, in the order they ended."""
    return [s for s in spans.get_finished_spans() if s.name == name]


def by_event_id(consumed: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    """Consume spans per CloudEvents id, each list in attempt order."""
    found: dict[str, list[ReadableSpan]] = {}
    for current in sorted(consumed, key=lambda s: s.start_time or 0):
        found.setdefault(str(current.attributes["cloudevents.event_id"]), []).append(current)
    return found


def events_of(current: ReadableSpan) -> list[tuple[str, dict[str, Any]]]:
    return [(event.name, dict(event.attributes or {})) for event in current.events]


def assert_no_marker(spans: InMemorySpanExporter) -> None:
    for finished in spans.get_finished_spans():
        assert MARKER not in str(finished.attributes) + str(finished.events)


async def test_one_trace_from_the_writer_through_the_relay_to_the_handler_and_on(
    span_exporter: InMemorySpanExporter, pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    spans = span_exporter
    spans.clear()
    downstream = f"{topic}-billed"
    engine = make_engine(pg_url)
    with (
        trace.get_tracer("test").start_as_current_span("place order") as producer_span,
        Session(engine) as session,
        session.begin(),
    ):
        placed = new_event("order.placed", "/shop", {"note": MARKER}, partitionkey="order-1")
        Outbox(default_topic=topic).add(session, placed)
    engine.dispose()
    await Relay(
        db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=RELAY_OPTIONS
    ).drain(timeout_s=scaled(60))
    (record,) = await read_topic(kafka_bootstrap, topic, expected=1)

    app = ConsumerApp(name="billing", retention_interval_s=None)
    current_in_handler: list[trace.SpanContext] = []

    @app.handler("order.placed", topic=topic)
    async def bill(event: CloudEvent, session: AsyncSession) -> None:
        current_in_handler.append(trace.get_current_span().get_span_context())
        billed = new_event("order.billed", "/billing", {"order": event.get_id()})
        await Outbox(default_topic=downstream).add_async(session, billed)

    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(lambda: alive(task) or runtime.stats.applied, bool, 60, "order applied")
    await Relay(
        db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=RELAY_OPTIONS
    ).drain(timeout_s=scaled(60))

    origin = producer_span.get_span_context()
    publishes = {s.attributes["cloudevents.event_type"]: s for s in named(spans, "outbox publish")}
    (consume,) = named(spans, "outbox consume")
    relay_span, next_publish = publishes["order.placed"], publishes["order.billed"]
    assert {s.context.trace_id for s in (relay_span, consume, next_publish)} == {origin.trace_id}
    assert consume.kind is SpanKind.CONSUMER
    assert consume.parent is not None and consume.parent.span_id == relay_span.context.span_id
    assert [link.context.span_id for link in consume.links] == [origin.span_id]
    assert consume.status.status_code is StatusCode.UNSET and not consume.events
    assert dict(consume.attributes) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": topic,
        "messaging.destination.partition.id": str(record.partition),
        "messaging.kafka.offset": record.offset,
        "messaging.consumer.group.name": runtime.group,
        "outboxkit.attempt": 1,
        "cloudevents.event_type": "order.placed",
        "cloudevents.event_source": "/shop",
        "cloudevents.event_id": placed.get_id(),
    }
    assert current_in_handler == [consume.context], "the span is current in the handler"
    # The event the handler wrote took the consumer span as its origin: the chain continues.
    assert next_publish.parent is not None
    assert next_publish.parent.span_id == consume.context.span_id
    assert_no_marker(spans)


async def test_retries_dead_letters_rollbacks_and_duplicates_show_on_consume_spans(
    span_exporter: InMemorySpanExporter, pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    spans = span_exporter
    spans.clear()
    await create_topic(kafka_bootstrap, topic, partitions=1)
    with trace.get_tracer("test").start_as_current_span("upstream") as upstream_span:
        origin_header = telemetry.current_context_headers()["traceparent"].encode()
    events = {
        name: new_event(f"order.{name}", "/shop", {"note": MARKER}, id=name)
        for name in ("ok1", "poison", "flaky", "ok2", "untraced")
    }
    records = []
    for name in ("ok1", "poison", "flaky", "ok2", "ok2", "untraced"):  # ok2 twice: a duplicate
        key, value, headers = binary_record(events[name])
        if name != "untraced":  # no hop header: the origin becomes the parent
            headers = [*headers, ("ce_traceparent", origin_header)]
        records.append((key, value, headers))
    await produce(kafka_bootstrap, topic, records)

    app = ConsumerApp(name="shipping", retry=FAST_RETRY, retention_interval_s=None)
    flaky_calls: list[int] = []

    class OrderRejected(PermanentError):
        """The poison record can never be shipped."""

    async def fine(event: CloudEvent) -> None:
        return None

    async def poison(event: CloudEvent) -> None:
        raise OrderRejected(f"rejected {MARKER}")

    async def flaky(event: CloudEvent) -> None:
        flaky_calls.append(1)
        if len(flaky_calls) == 1:
            raise TransientError(f"try again {MARKER}")

    for name, handler in (("ok1", fine), ("poison", poison), ("flaky", flaky)):
        app.handler(f"order.{name}", topic=topic)(handler)
    app.handler("order.ok2", topic=topic)(fine)
    app.handler("order.untraced", topic=topic)(fine)

    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or (runtime.stats.applied, runtime.stats.dead_lettered),
            lambda counts: counts == (4, 1),
            60,
            "4 applied and 1 dead-lettered",
        )
    assert runtime.stats.duplicates == 1 and runtime.stats.retries == 1

    found = by_event_id(named(spans, "outbox consume"))
    assert sorted(found) == ["flaky", "ok1", "ok2", "poison", "untraced"], "no span for a duplicate"
    upstream = upstream_span.get_span_context()
    for current in (s for name, ss in found.items() if name != "untraced" for s in ss):
        assert current.kind is SpanKind.CONSUMER
        assert current.context.trace_id == upstream.trace_id
        assert current.parent is not None and current.parent.span_id == upstream.span_id
        assert not current.links, "the origin is the parent, not a link, without a hop"
    (untraced,) = found["untraced"]
    assert untraced.parent is None and untraced.context.trace_id != upstream.trace_id
    offsets = {
        name: [s.attributes["messaging.kafka.offset"] for s in ss] for name, ss in found.items()
    }
    assert offsets == {"ok1": [0, 0], "poison": [1], "flaky": [2, 2], "ok2": [3], "untraced": [5]}

    # The poison record failed the optimistic chunk: ok1 ran, was rolled back, and ran again.
    first_ok1, second_ok1 = found["ok1"]
    assert events_of(first_ok1) == [("consume.rolled_back", {})]
    assert first_ok1.status.status_code is StatusCode.UNSET
    assert not second_ok1.events and second_ok1.status.status_code is StatusCode.UNSET

    (dead,) = found["poison"]
    assert events_of(dead) == [
        (
            "consume.dead_lettered",
            {
                "attempt": 1,
                "error.type": "OrderRejected",
                "outboxkit.error_class": "permanent:OrderRejected",
            },
        )
    ]
    assert dead.status.status_code is StatusCode.ERROR
    assert dead.status.description == "OrderRejected"

    failed, retried = found["flaky"]
    assert [s.attributes["outboxkit.attempt"] for s in (failed, retried)] == [1, 2]
    assert events_of(failed) == [("consume.retry", {"attempt": 1, "error.type": "TransientError"})]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "TransientError"
    assert not retried.events and retried.status.status_code is StatusCode.UNSET
    assert_no_marker(spans)


def test_action_events_name_their_operation_and_structured_events_keep_their_origin(
    span_exporter: InMemorySpanExporter,
) -> None:
    """No broker needed: the span of a record that came in structured mode (the origin is an
    extension inside the event, no ``ce_`` header) for an agent-action event."""
    spans = span_exporter
    spans.clear()
    with trace.get_tracer("test").start_as_current_span("agent step") as step_span:
        origin = telemetry.current_context_headers()["traceparent"]
    key = "acme:run-7:refund:payments.refund:ch_1:1"
    event = new_event(
        STARTED,
        "/outboxkit/actions",
        {"note": MARKER},
        subject=key,
        extensions={"traceparent": origin},
    )
    record = ConsumerRecord("actions", 2, 41, 0, 0, None, b"{}", None, 0, 2, [])
    HandlerTelemetry("audit-group", "audit").start(record, event, 3).end()

    (consume,) = named(spans, "outbox consume")
    assert consume.attributes["cloudevents.event_subject"] == key
    assert consume.attributes["outboxkit.attempt"] == 3
    assert consume.attributes["messaging.kafka.offset"] == 41
    assert consume.attributes["messaging.destination.partition.id"] == "2"
    assert consume.parent is not None
    assert consume.parent.span_id == step_span.get_span_context().span_id
    assert_no_marker(spans)


async def test_a_batch_handler_call_gives_each_event_its_span_and_a_failed_batch_goes_again_alone(
    span_exporter: InMemorySpanExporter, pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    spans = span_exporter
    spans.clear()
    await create_topic(kafka_bootstrap, topic)
    records = []
    hops: dict[str, int] = {}  # event id -> span id of the hop its record carries
    for n in range(4):
        with trace.get_tracer("test").start_as_current_span(f"hop {n}") as hop:
            key, value, headers = binary_record(
                new_event("widget.created", "/widgets", {"n": n}, id=f"b-{n}", partitionkey="k")
            )
            records.append((key, value, [*headers, telemetry.hop_header(hop)]))
            hops[f"b-{n}"] = hop.get_span_context().span_id
    await produce(kafka_bootstrap, topic, records)

    app = ConsumerApp(name="batcher", retry=FAST_RETRY, retention_interval_s=None)
    calls: list[list[str]] = []

    @app.batch_handler("widget.created", topic=topic)
    async def record_all(events: list[CloudEvent], session: AsyncSession) -> None:
        calls.append([e.get_id() for e in events])
        if len(calls) == 1:
            raise TransientError("first batch call fails")  # the culprit is unknown: all go alone

    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        await wait_for(
            lambda: alive(task) or runtime.stats.applied, lambda n: n >= 4, 60, "4 applied"
        )
    assert calls[0] == ["b-0", "b-1", "b-2", "b-3"]
    assert [ids for ids in calls[1:] if len(ids) == 1][:1] == [["b-0"]]
    per_event = by_event_id(named(spans, "outbox consume"))
    assert sorted(per_event) == ["b-0", "b-1", "b-2", "b-3"]
    for event_id, attempts in per_event.items():
        assert all(s.kind is SpanKind.CONSUMER for s in attempts)
        assert all(s.parent is not None and s.parent.span_id == hops[event_id] for s in attempts)
        assert ("consume.rolled_back", {}) in events_of(attempts[0])  # the failed batch call
        assert attempts[-1].status.status_code is not StatusCode.ERROR  # applied at last
    offsets = {int(per_event[e][-1].attributes["messaging.kafka.offset"]) for e in per_event}
    assert offsets == {0, 1, 2, 3}
