"""Consumer metrics scraped over real HTTP after a scripted run: N applied, D duplicates, 1 DLQ;
and the lag gauge read in-process while a handler holds a partition."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

from outboxkit.consumers import ConsumerApp
from outboxkit.consumers.metrics import RuntimeCollector
from outboxkit.outbox import new_event
from outboxkit.testing.kafka import create_topic, free_port
from outboxkit.testing.processes import start_cli, terminate
from prometheus_client import REGISTRY

from tests.support.consumer_apps import WIDGET_TYPE, Widget
from tests.support.consumers import (
    alive,
    create_effects_table,
    effect_rows,
    produce_events,
    running,
)
from tests.support.kafka import wait_for
from tests.support.waits import scaled

SECRET = "MARKER-c0ffee-never-in-telemetry"
N, D = 12, 3


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=scaled(5)
        ) as response:
            return response.read().decode()
    except OSError:
        return ""


def _lags(text: str, topic: str) -> dict[str, float]:
    """``outboxkit_consumer_lag`` of the effects consumer per partition of ``topic``."""
    lags: dict[str, float] = {}
    for labels, value in re.findall(r"^outboxkit_consumer_lag\{(.*)\} (\S+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if found.get("consumer") == "effects" and found.get("topic") == topic:
            lags[found["partition"]] = float(value)
    return lags


def _value(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    assert match, f"{sample} not exposed"
    return float(match.group(1))


async def test_counters_equal_applied_duplicates_and_dead_letters(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    create_effects_table(pg_url)
    events = [new_event(WIDGET_TYPE, "/metrics", {"n": n, "note": SECRET}) for n in range(N)]
    bad = new_event(WIDGET_TYPE, "/metrics", {"n": f"not a number {SECRET}"})
    await produce_events(kafka_bootstrap, topic, [*events, *events[:D], bad])
    port = free_port()
    log = tmp_path / "consumer.log"
    args = ["consume", "tests.support.consumer_apps:effects_app", "--db-url", pg_url]
    args += ["--bootstrap", kafka_bootstrap, "--metrics-port", str(port)]
    consumer = start_cli(
        args,
        log,
        env={"OUTBOXKIT_TEST_TOPIC": topic},
    )
    try:
        text = await wait_for(
            lambda: _scrape(port),
            lambda t: (
                'outboxkit_consumer_dead_lettered_total{consumer="effects"' in t
                and f'outboxkit_consumer_processed_total{{consumer="effects"}} {N}.0' in t
                and set(_lags(t, topic).values()) == {0.0}
            ),
            90,
            "the run reflected in the metrics",
        )
    finally:
        assert terminate(consumer) == 0
    assert len(effect_rows(pg_url)) == N
    assert _value(text, 'outboxkit_consumer_processed_total{consumer="effects"}') == N
    assert _value(text, 'outboxkit_consumer_duplicates_total{consumer="effects"}') == D
    letters = re.findall(r"^outboxkit_consumer_dead_lettered_total\{.*\} (\S+)$", text, re.M)
    assert [float(v) for v in letters] == [1.0]
    assert 'error_class="permanent:ValidationError"' in text
    assert (
        _value(text, 'outboxkit_consumer_handler_seconds_count{event_type="widget.created"}') >= N
    )
    effect = 'outboxkit_consumer_commit_to_effect_seconds_count{consumer="effects"}'
    assert _value(text, effect) == N, "one observation per applied event"
    assert _lags(text, topic) == {"0": 0.0}, "everything handled: no lag"
    assert SECRET not in text
    assert SECRET not in log.read_text()


async def test_lag_counts_records_a_blocked_handler_holds_back_then_drops_to_zero(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    await create_topic(kafka_bootstrap, topic, partitions=1)
    await produce_events(
        kafka_bootstrap, topic, [new_event(WIDGET_TYPE, "/lag", {"n": n}) for n in range(5)]
    )
    app = ConsumerApp(name=f"lag-{topic}", retention_interval_s=None)
    gate = asyncio.Event()

    @app.handler(WIDGET_TYPE, topic=topic)
    async def wait_at_the_gate(widget: Widget) -> None:
        await gate.wait()

    def lag() -> dict[tuple[str, str], float]:
        (family,) = [
            f for f in RuntimeCollector(runtime).collect() if f.name == "outboxkit_consumer_lag"
        ]
        return {(s.labels["topic"], s.labels["partition"]): s.value for s in family.samples}

    effects = ("outboxkit_consumer_commit_to_effect_seconds_count", {"consumer": app.name})
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        try:
            await wait_for(
                lambda: alive(task) or lag(), lambda x: x == {(topic, "0"): 5.0}, 60, "lag 5"
            )
            assert REGISTRY.get_sample_value(*effects) == 0, "nothing committed yet"
        finally:
            gate.set()  # or stopping the runtime would wait for the handler forever
        await wait_for(
            lambda: alive(task) or lag(), lambda x: x == {(topic, "0"): 0.0}, 60, "lag 0"
        )
        assert REGISTRY.get_sample_value(*effects) == 5
    assert lag() == {}, "a stopped runtime reports no partitions"
