"""Workflow metrics: the gauges read from the tables at scrape time, the counters, and the fault
test "cut telemetry and carry on": a collector whose database read hangs and fails leaves the
scrape answering (``collector_up 0``) and the workers advancing their workflows."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from outboxkit.outbox.metrics_server import serve_metrics
from outboxkit.workflows import Status, WorkflowWorker
from outboxkit.workflows import store as workflow_store
from outboxkit.workflows.metrics import WorkflowCollector
from prometheus_client import REGISTRY, CollectorRegistry

from tests.support import workflow_ops as w
from tests.support.actions import sessions_for
from tests.support.kafka import wait_for
from tests.support.waits import scaled


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_gauges_follow_the_instances_and_counters_their_transitions(db_url: str) -> None:
    before = {
        "duplicate": counter("outboxkit_workflow_signals_total", outcome="duplicate"),
        "compensate": counter(
            "outboxkit_workflow_transitions_total", workflow="po", kind="compensate"
        ),
        "unknown": counter(
            "outboxkit_workflow_failures_total", workflow="po", failure_class="unknown_outcome"
        ),
    }
    async with sessions_for(db_url) as sessions:
        engine = w.build_engine(sessions)
        # PO-wait awaits its approval; PO-unk is in human_review with an unknown order; PO-comp
        # issued its order and is cancelled: it is compensating
        for workflow_id, mode in (("PO-wait", "ok"), ("PO-unk", "unknown"), ("PO-comp", "ok")):
            await w.start(engine, workflow_id, mode=mode)
            await w.settle(engine, workflow_id, lambda r: r.status is Status.WAITING)
        for workflow_id in ("PO-unk", "PO-comp"):
            await w.approve(engine, workflow_id)
        assert await w.approve(engine, "PO-unk") is None  # the same signal again: a duplicate
        await w.settle(engine, "PO-unk", lambda r: r.state == "human_review")
        await w.settle(engine, "PO-comp", lambda r: r.state == "await_delivery")
        async with sessions() as session, session.begin():
            await engine.cancel(session, "acme", "PO-comp", by="ops", reason="withdrawn")
        await w.settle(engine, "PO-comp", lambda r: r.state == "compensating")
        # PO-new is started and never run; a worker claims PO-comp and PO-new, then dies
        await w.start(engine, "PO-new")
        async with sessions() as session, session.begin():
            claimed = await workflow_store.claim_due(
                session, holder="dead-worker", now_ms=engine.now_ms(), lease_ms=1, limit=10
            )
        assert sorted(r.workflow_id for r in claimed) == ["PO-comp", "PO-new"]

        collector = WorkflowCollector.for_url(db_url, clock=lambda: time.time() + 60)
        registry = CollectorRegistry()
        registry.register(collector)
        await wait_for(
            lambda: sample(
                registry, "outboxkit_workflow_stuck", workflow="po", reason="lease_expired"
            ),
            lambda value: value == 2,
            10,
            "the dead worker's leases to run out",
        )
        instances = {
            state: sample(registry, "outboxkit_workflow_instances", workflow="po", state=state)
            for state in ("await_approval", "human_review", "compensating", "intake", "complete")
        }
        assert instances == {
            "await_approval": 1,
            "human_review": 1,
            "compensating": 1,
            "intake": 1,
            "complete": None,
        }
        # ages are measured on the given clock (60 s ahead here)
        in_state = sample(
            registry,
            "outboxkit_workflow_oldest_in_state_seconds",
            workflow="po",
            state="await_approval",
        )
        assert 60 <= in_state < 120
        assert sample(registry, "outboxkit_workflow_open_unknowns", workflow="po") == 1
        assert (
            60 <= sample(registry, "outboxkit_workflow_oldest_unknown_seconds", workflow="po") < 120
        )
        assert sample(registry, "outboxkit_workflow_approvals_waiting", workflow="po") == 1
        oldest_approval = sample(
            registry, "outboxkit_workflow_oldest_approval_wait_seconds", workflow="po"
        )
        assert 60 <= oldest_approval < 120
        assert sample(registry, "outboxkit_workflow_compensating", workflow="po") == 1
        assert sample(registry, "outboxkit_workflow_compensations_left", workflow="po") == 1
        assert sample(registry, "outboxkit_workflow_stuck", workflow="po", reason="overdue") is None
        assert 60 <= sample(registry, "outboxkit_workflow_oldest_due_seconds", workflow="po") < 120
        assert sample(registry, "outboxkit_workflow_collector_up") == 1
        eager = CollectorRegistry()
        eager.register(WorkflowCollector(collector.engine, stuck_after_s=0))
        assert sample(eager, "outboxkit_workflow_stuck", workflow="po", reason="overdue") == 2

        # a live worker takes the dead one's instances over: the compensation runs, PO-new goes on
        await w.settle(engine, "PO-comp", lambda r: r.terminal)
        await w.settle(engine, "PO-new", lambda r: r.status is Status.WAITING)
        assert (
            sample(registry, "outboxkit_workflow_instances", workflow="po", state="cancelled") == 1
        )
        assert sample(registry, "outboxkit_workflow_compensating", workflow="po") is None
        assert (
            sample(registry, "outboxkit_workflow_stuck", workflow="po", reason="lease_expired")
            is None
        )
        assert sample(registry, "outboxkit_workflow_approvals_waiting", workflow="po") == 2
        collector.engine.dispose()

    assert (
        counter("outboxkit_workflow_signals_total", outcome="duplicate") - before["duplicate"] == 1
    )
    compensated = counter("outboxkit_workflow_transitions_total", workflow="po", kind="compensate")
    assert compensated - before["compensate"] == 1
    unknown = counter(
        "outboxkit_workflow_failures_total", workflow="po", failure_class="unknown_outcome"
    )
    assert unknown - before["unknown"] == 2  # once reconciled by key, then to human_review


@contextmanager
def blackhole() -> Iterator[int]:
    """A port that accepts TCP connections and never answers: a metrics database that hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def scrape(port: int) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=scaled(30)) as answer:
        return answer.status, answer.read().decode()


async def test_workers_carry_on_when_the_metrics_read_hangs_and_fails(db_url: str) -> None:
    with blackhole() as port:
        collector = WorkflowCollector.for_url(
            f"postgresql://metrics:secret@127.0.0.1:{port}/outbox", timeout_s=1
        )
        registry = CollectorRegistry()
        registry.register(collector)  # describing touches no database
        server = serve_metrics(0, registry=registry)
        scrapes: list[tuple[int, str]] = []
        stop = threading.Event()

        def scrape_all_along() -> None:
            while not stop.is_set():
                scrapes.append(scrape(server.port))

        scraper = threading.Thread(target=scrape_all_along, daemon=True)
        ids = [f"PO-{n}" for n in range(5)]
        try:
            scraper.start()
            async with sessions_for(db_url) as sessions:
                engine = w.build_engine(sessions)
                async with WorkflowWorker(engine, poll_interval_s=0.05):
                    for workflow_id in ids:
                        await w.start(engine, workflow_id)
                    for workflow_id in ids:
                        await wait_for(
                            lambda i=workflow_id: w.get(engine, i),
                            lambda r: r.status is Status.WAITING,
                            30,
                            f"{workflow_id} to wait for its approval",
                        )
                        await w.approve(engine, workflow_id)
                    for workflow_id in ids:
                        await wait_for(
                            lambda i=workflow_id: w.get(engine, i),
                            lambda r: r.state == "await_delivery",
                            30,
                            f"{workflow_id} to issue its order",
                        )
                    await wait_for(lambda: len(scrapes), lambda n: n >= 2, 30, "two scrapes")
        finally:
            stop.set()
            await asyncio.to_thread(scraper.join, 30)
            server.close()
            collector.engine.dispose()
    assert len(scrapes) >= 2 and collector.failures >= 2
    for status, text in scrapes:
        assert status == 200
        assert "outboxkit_workflow_collector_up 0.0" in text
        assert "outboxkit_workflow_instances{" not in text
        assert "secret" not in text
