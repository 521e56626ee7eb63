"""Relay tracing and metrics: spans joined to the producer's trace, counters over real HTTP."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from cloudevents.core.v1.event import CloudEvent
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from outboxkit.consumers import ConsumerApp
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay, RelayOptions
from outboxkit.testing.kafka import free_port
from outboxkit.testing.processes import start_cli, terminate
from sqlalchemy.orm import Session

from tests.support.consumers import alive, running
from tests.support.kafka import read_topic, wait_for
from tests.support.waits import scaled

SECRET = "MARKER-7f3a-do-not-log"


@pytest.fixture(scope="module")
def spans(span_exporter: InMemorySpanExporter) -> InMemorySpanExporter:
    return span_exporter  # the process-wide provider of tests/conftest.py


async def test_publish_span_joins_the_trace_of_the_writing_transaction(
    spans: InMemorySpanExporter, sqlite_url: str, kafka_bootstrap: str, topic: str
) -> None:
    spans.clear()
    engine = make_engine(sqlite_url)
    tracer = trace.get_tracer("test")
    with (
        tracer.start_as_current_span("place order") as producer_span,
        Session(engine) as session,
        session.begin(),
    ):
        event = new_event("order.placed", "/shop", {"x": SECRET})
        Outbox(default_topic=topic).add(session, event)
    engine.dispose()

    options = RelayOptions(lease_ttl_s=5.0, request_timeout_s=2.0, retention_s=3600)
    await Relay(
        db_url=sqlite_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=options
    ).drain(timeout_s=scaled(60))

    (publish,) = [s for s in spans.get_finished_spans() if s.name == "outbox publish"]
    assert publish.context.trace_id == producer_span.get_span_context().trace_id
    assert publish.parent.span_id == producer_span.get_span_context().span_id
    assert publish.attributes["cloudevents.event_type"] == "order.placed"
    assert publish.attributes["messaging.destination.name"] == topic
    assert "messaging.kafka.offset" in publish.attributes
    (record,) = await read_topic(kafka_bootstrap, topic, expected=1)
    headers = dict(record.headers)
    origin = f"{producer_span.get_span_context().span_id:016x}".encode()
    assert origin in headers["ce_traceparent"], "the event keeps the originating trace"
    hop = f"{publish.context.span_id:016x}".encode()
    assert hop in headers["traceparent"], "the Kafka header carries the relay's hop"

    # The consumer's span of the same event must not carry the marker either.
    app = ConsumerApp(name="marker-check", retention_interval_s=None)

    @app.handler("order.placed", topic=topic)
    async def on_order(event: CloudEvent) -> None:
        assert event.get_data() == {"x": SECRET}

    async with running(app, sqlite_url, kafka_bootstrap) as (runtime, task):
        await wait_for(lambda: alive(task) or runtime.stats.applied, bool, 60, "the event applied")
    (consume,) = [s for s in spans.get_finished_spans() if s.name == "outbox consume"]
    assert consume.parent.span_id == publish.context.span_id
    for finished in spans.get_finished_spans():
        assert SECRET not in str(finished.attributes) + str(finished.events)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=scaled(5)) as response:
        return response.read().decode()


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not exposed"
    return float(match.group(1))


async def test_relay_metrics_count_what_it_published_and_parked(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_url)
    outbox = Outbox(default_topic=topic)
    with Session(engine) as session, session.begin():
        for n in range(40):
            outbox.add(session, new_event("m", "/s", {"n": n, "secret": SECRET}))
        outbox.add(session, new_event("m", "/s", {"blob": "x" * 200_000}, partitionkey="big"))
    engine.dispose()
    port = free_port()
    args = ["relay", "--db-url", pg_url, "--bootstrap", kafka_bootstrap, "--metrics-port"]
    args += [str(port), "--max-attempts", "1", "--lease-ttl", "3", "--request-timeout-ms", "1500"]
    args += ["--max-request-size", "100000"]
    relay = start_cli(args, tmp_path / "relay.log")
    try:
        text = await wait_for(
            lambda: _scrape_or_empty(port),
            lambda t: (
                "outboxkit_relay_published_total 40.0" in t
                and "outboxkit_relay_parked_total 1.0" in t
            ),
            60,
            "40 published in metrics",
        )
    finally:
        assert terminate(relay) == 0
    assert metric(text, "outboxkit_relay_published_total") == 40
    assert metric(text, 'outboxkit_relay_publish_errors_total{kind="record"}') == 1
    assert metric(text, "outboxkit_relay_parked_total") == 1
    assert SECRET not in text
    assert SECRET not in (tmp_path / "relay.log").read_text()


def _scrape_or_empty(port: int) -> str:
    try:
        return scrape(port)
    except OSError:
        return ""
