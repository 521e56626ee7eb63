"""A consumer group with lag and no commits (docs/observability.md#stalls), on real Kafka and
PostgreSQL: the runtime says so itself (one log line, ``/readyz`` not ready naming it,
``outboxkit_consumer_stalled``) and ``outboxkit status`` sees it from outside (the commit
times the runtime stamps, the next record's timestamp); while events flow, neither does."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaProducer
from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp, ConsumerRuntime
from outboxkit.consumers.metrics import RuntimeCollector
from outboxkit.testing.kafka import create_topic
from sqlalchemy.ext.asyncio import AsyncSession

from tests.support.consumer_apps import WIDGET_TYPE, Widget
from tests.support.consumers import binary_record, running, widget
from tests.support.kafka import wait_for
from tests.support.ops import cli
from tests.support.waits import scaled

STALL_S = 4.0


def gated_app(topic: str, gate: asyncio.Event) -> ConsumerApp:
    """An app whose handler waits for ``gate``: cleared, a handler that never returns."""
    app = ConsumerApp(name="stallee", retention_interval_s=None)

    @app.handler(WIDGET_TYPE, topic=topic)
    async def record(item: Widget, event: CloudEvent, session: AsyncSession) -> None:
        await gate.wait()  # applied: counted in runtime.stats.applied

    return app


@contextlib.asynccontextmanager
async def producing(bootstrap: str, topic: str, every_s: float = 0.1) -> AsyncIterator[None]:
    """Send a widget every ``every_s`` until the block ends."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()

    async def send() -> None:
        n = 0
        while True:
            key, value, headers = binary_record(widget(n))
            await producer.send_and_wait(topic, value, key=key, headers=list(headers))
            n += 1
            await asyncio.sleep(every_s)

    task = asyncio.create_task(send())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await producer.stop()


def stalled_gauge(runtime: ConsumerRuntime) -> float:
    for family in RuntimeCollector(runtime).collect():
        if family.name == "outboxkit_consumer_stalled":
            return float(family.samples[0].value)
    raise AssertionError("no outboxkit_consumer_stalled")


async def status(pg_url: str, bootstrap: str, group: str) -> tuple[int, str]:
    result = await cli(
        "status",
        "--db-url",
        pg_url,
        "--bootstrap",
        bootstrap,
        "--group",
        group,
        "--max-group-stall",
        f"{STALL_S:g}s",
    )
    return result.code, result.err


async def test_a_group_with_lag_and_no_commits_is_named_and_a_flowing_one_is_not(
    pg_url: str, kafka_bootstrap: str, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "outboxkit.consumer")
    await create_topic(kafka_bootstrap, topic)
    gate = asyncio.Event()
    gate.set()
    app = gated_app(topic, gate)
    async with (
        running(app, pg_url, kafka_bootstrap, stall_after_s=STALL_S) as (runtime, _),
        producing(kafka_bootstrap, topic),
    ):
        try:
            await wait_for(lambda: runtime.stats.offset_commits, lambda n: n > 0, 60, "commits")
            until = time.monotonic() + 2 * STALL_S
            applied = runtime.stats.applied
            while time.monotonic() < until:  # events flow: no alarm from inside or outside
                assert "stalled" not in runtime.readiness.ready()[1].get("not_ready", {})
                assert stalled_gauge(runtime) == 0
                code, err = await status(pg_url, kafka_bootstrap, runtime.group)
                assert code == 0, err
                await asyncio.sleep(0.5)
            assert runtime.stats.applied > applied + 20, "events flowed meanwhile"

            gate.clear()  # the handler hangs: lag grows, nothing is committed
            stuck_at = time.monotonic()
            await wait_for(
                lambda: runtime.readiness.ready()[1].get("not_ready", {}),
                lambda problems: "stalled" in problems,
                STALL_S + 10,
                "/readyz naming the stall",
            )
            elapsed = time.monotonic() - stuck_at
            assert STALL_S <= elapsed <= STALL_S + scaled(3), elapsed
            assert stalled_gauge(runtime) == 1
            code, err = await status(pg_url, kafka_bootstrap, runtime.group)
            assert code == 1 and f"consumer group {runtime.group} is stalled" in err, err
            report = await cli(
                "status", "--json", "--db-url", pg_url, "--bootstrap", kafka_bootstrap,
                "--group", runtime.group, "--max-group-stall", f"{STALL_S:g}s",
            )  # fmt: skip
            [partition] = report.json()["consumers"]["groups"][0]["partitions"]
            assert partition["committed_age_s"] > STALL_S  # the runtime's stamp, read back
            assert partition["waiting_age_s"] > STALL_S

            gate.set()
            await wait_for(
                lambda: runtime.readiness.ready()[1].get("not_ready", {}),
                lambda problems: "stalled" not in problems,
                30,
                "the stall cleared",
            )
        finally:
            gate.set()  # a failed check must not leave the handler hanging at the stop
    lines = [r.getMessage() for r in caplog.records if r.name == "outboxkit.consumer"]
    assert sum(line.startswith("stalled: ") for line in lines) == 1, lines
    assert sum(line.startswith("stalled cleared after") for line in lines) == 1, lines
