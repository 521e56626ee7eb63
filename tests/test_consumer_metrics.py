"""Consumer metrics scraped over real HTTP after a scripted run: N applied, D duplicates, 1 DLQ."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from outbox import new_event
from outbox.dev.kafka import free_port
from tests.consumer_apps import WIDGET_TYPE
from tests.consumer_helpers import create_effects_table, effect_rows, produce_events
from tests.kafka_helpers import wait_for
from tests.processes import start_cli, terminate

SECRET = "MARKER-c0ffee-never-in-telemetry"
N, D = 12, 3


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()
    except OSError:
        return ""


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
    args = ["consume", "tests.consumer_apps:effects_app", "--db-url", pg_url]
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
    assert SECRET not in text
    assert SECRET not in log.read_text()
