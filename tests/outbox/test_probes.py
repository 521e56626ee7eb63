"""The probe server: /healthz, /readyz and /metrics of the relay and of consumers, as documented
in docs/observability.md#probes, and /readyz through database and broker outages."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from outboxkit.consumers import ConsumerRuntime
from outboxkit.migrations.runner import upgrade
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.metrics_server import serve_metrics
from outboxkit.outbox.readiness import Readiness
from outboxkit.relay import Relay, RelayOptions
from outboxkit.testing.kafka import KafkaBroker, create_topic
from outboxkit.testing.postgres import TlsCluster
from outboxkit.testing.processes import start_cli, terminate
from prometheus_client import CollectorRegistry, Counter

from tests.support.consumers import create_effects_table, effects_app_for
from tests.support.kafka import wait_for
from tests.support.waits import scaled


def get(port: int, path: str) -> tuple[int, str]:
    """GET http://127.0.0.1:PORT/PATH: (status, body); 5xx answers too."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=scaled(5)) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_probe_answers_follow_the_readiness_facts() -> None:
    registry = CollectorRegistry()
    Counter("probe_test_total", "a counter", registry=registry).inc()
    readiness = Readiness(assigned_what="shard_leases", min_assigned=1)
    server = serve_metrics(0, readiness=readiness, registry=registry)
    try:
        assert server.address == "127.0.0.1"  # never all interfaces unless asked
        status, body = await asyncio.to_thread(get, server.port, "/readyz")
        assert status == 503
        assert json.loads(body)["not_ready"]["process"] == "not started"
        readiness.start()
        readiness.mark_database(True)
        readiness.mark_broker(False, "KafkaConnectionError")
        readiness.mark_assigned(0)
        status, body = await asyncio.to_thread(get, server.port, "/readyz")
        assert status == 503
        assert json.loads(body)["not_ready"] == {
            "broker": "KafkaConnectionError",
            "shard_leases": "0 held, needs 1",
        }
        readiness.mark_broker(True)
        readiness.mark_assigned(3)
        assert await asyncio.to_thread(get, server.port, "/readyz") == (
            200,
            '{"shard_leases_held": 3, "status": "ready"}\n',
        )
        assert (await asyncio.to_thread(get, server.port, "/healthz"))[0] == 200
        metrics = await asyncio.to_thread(get, server.port, "/metrics")
        assert metrics[0] == 200 and "probe_test_total 1.0" in metrics[1]
        assert (await asyncio.to_thread(get, server.port, "/other"))[0] == 404
        # stopping: not ready; a loop that stops beating is not alive
        await readiness.stop()
        readiness.stale_after_s = 0.2
        await asyncio.sleep(0.3)
        status, body = await asyncio.to_thread(get, server.port, "/readyz")
        assert status == 503 and json.loads(body)["not_ready"]["process"] == "stopping"
        status, body = await asyncio.to_thread(get, server.port, "/healthz")
        assert status == 503 and json.loads(body)["status"] == "stale"
    finally:
        server.close()


def test_a_taken_port_is_one_error_line() -> None:
    server = serve_metrics(0, registry=CollectorRegistry())
    try:
        with pytest.raises(Exception, match=f"cannot serve metrics on 127.0.0.1:{server.port}"):
            serve_metrics(server.port, registry=CollectorRegistry())
    finally:
        server.close()


async def test_relay_and_consumer_processes_answer_probes(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic, partitions=2)
    relay_port, consumer_port = free_port(), free_port()
    common = ["--db-url", pg_url, "--bootstrap", kafka_bootstrap]
    relay = start_cli(
        ["relay", *common, "--metrics-port", str(relay_port), "--metrics-address", "127.0.0.1"],
        tmp_path / "relay.log",
    )
    consumer = start_cli(
        [
            "consume",
            "tests.support.consumer_apps:effects_app",
            *common,
            *("--group", f"g-{topic}", "--metrics-port", str(consumer_port)),
        ],
        tmp_path / "consumer.log",
        env={"OUTBOXKIT_TEST_TOPIC": topic},
    )
    try:
        ready = await wait_for(
            lambda: asyncio.to_thread(get, relay_port, "/readyz"),
            lambda answer: answer[0] == 200,
            60,
            "the relay's readiness",
        )
        assert json.loads(ready[1]) == {"shard_leases_held": 64, "status": "ready"}
        assert (await asyncio.to_thread(get, relay_port, "/healthz"))[0] == 200
        assert "outboxkit_relay" in (await asyncio.to_thread(get, relay_port, "/metrics"))[1]
        ready = await wait_for(
            lambda: asyncio.to_thread(get, consumer_port, "/readyz"),
            lambda answer: answer[0] == 200,
            60,
            "the consumer's readiness",
        )
        assert json.loads(ready[1]) == {"partitions_held": 2, "status": "ready"}
        assert (await asyncio.to_thread(get, consumer_port, "/healthz"))[0] == 200
    finally:
        codes = [terminate(relay), terminate(consumer)]
    assert codes == [0, 0], [
        (tmp_path / n).read_text()[-2000:] for n in ("relay.log", "consumer.log")
    ]


async def test_readyz_says_not_ready_through_outages_and_logs_once_per_failure(
    tls_pg: TlsCluster, own_kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    db_url = f"{tls_pg.url}?sslmode=verify-full&sslrootcert={tls_pg.ca_file}"
    create_effects_table(db_url)
    topic = "probe-outage"
    await create_topic(own_kafka.bootstrap, topic, partitions=1)
    kafka = KafkaSettings(bootstrap=own_kafka.bootstrap)
    relay = Relay(
        db_url=db_url,
        kafka=kafka,
        options=RelayOptions(lease_ttl_s=3.0, request_timeout_s=1.0, poll_interval_s=0.2),
    )
    runtime = ConsumerRuntime(
        effects_app_for(topic, name="probes"),
        kafka=kafka,
        db_url=db_url,
        group="probe-outage",
        consumer_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
    )
    servers = [
        serve_metrics(0, readiness=p.readiness, registry=CollectorRegistry())
        for p in (relay, runtime)
    ]
    caplog.set_level(logging.INFO, logger="outboxkit")

    async def readyz() -> list[tuple[int, Any]]:
        answers = [await asyncio.to_thread(get, s.port, "/readyz") for s in servers]
        return [(code, json.loads(body) if code in (200, 503) else body) for code, body in answers]

    async def wait_ready(what: str) -> None:
        await wait_for(readyz, lambda a: [c for c, _ in a] == [200, 200], 90, what)

    def not_ready_on(part: str) -> Any:
        return lambda a: all(c == 503 and part in b.get("not_ready", {}) for c, b in a)

    try:
        await relay.start()
        await runtime.start()
        await wait_ready("both ready")

        tls_pg.stop()
        await wait_for(readyz, not_ready_on("database"), 60, "not ready: database")
        await asyncio.sleep(3)  # several failed attempts and probes meanwhile
        tls_pg.start()
        await wait_ready("both ready after the database came back")

        own_kafka.stop()
        await wait_for(readyz, not_ready_on("broker"), 90, "not ready: broker")
        await asyncio.sleep(3)
        own_kafka.start()
        await wait_ready("both ready after the broker came back")
    finally:
        await asyncio.gather(relay.stop(), runtime.stop(), return_exceptions=True)
        for server in servers:
            server.close()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("outboxkit")]
    down = [line for line in lines if "unavailable" in line]
    # One line per dependency, per process, per outage, not one per attempt (3 s of attempts
    # every 0.2-1 s); a second one when the cause changes within the outage (the connection
    # refused, then the server starting up: another error class).
    database_lines = sum("database" in line for line in down)
    broker_lines = sum(("kafka" in line or "broker" in line) for line in down)
    assert 2 <= database_lines <= 4, down
    assert 2 <= broker_lines <= 4, down


@pytest.mark.parametrize("waiting_for", ["broker", "database"])
async def test_a_waiting_consumer_names_the_cause_in_readyz(
    waiting_for: str, tmp_path: Path
) -> None:
    """``consume`` started while its broker (or database) is down waits, and its ``/readyz``
    says why, as its log line does, not "not checked yet"."""
    closed = free_port()  # nothing listens there
    db_url = f"sqlite:///{tmp_path / 'consumer.db'}"
    bootstrap = f"127.0.0.1:{closed}"
    if waiting_for == "database":
        db_url = f"postgresql://postgres:postgres@127.0.0.1:{closed}/postgres"
        bootstrap = "127.0.0.1:9092"  # never reached: the database is checked first
    else:
        upgrade(db_url)
        create_effects_table(db_url)
    port = free_port()
    consumer = start_cli(
        [
            "consume",
            "tests.support.consumer_apps:effects_app",
            *("--db-url", db_url, "--bootstrap", bootstrap, "--metrics-port", str(port)),
        ],
        tmp_path / "consumer.log",
    )
    log_path = tmp_path / "consumer.log"

    def logged() -> list[str]:
        return [line for line in log_path.read_text().splitlines() if "unavailable:" in line]

    try:
        # /readyz is read once the log has named the cause: they must say the same
        await wait_for(
            lambda: asyncio.to_thread(logged),
            lambda lines: bool(lines) or consumer.poll() is not None,
            60,
            f"the log line naming the {waiting_for}",
        )
        assert consumer.poll() is None, log_path.read_text()[-2000:]
        status, body = await asyncio.to_thread(get, port, "/readyz")
        assert status == 503, body
        not_ready = json.loads(body)["not_ready"]
        cause = not_ready[waiting_for]
        assert re.fullmatch(r"unreachable \((\w+)\)", cause), not_ready
        if waiting_for == "broker":
            assert cause == "unreachable (KafkaConnectionError)", not_ready
            assert "database" not in not_ready, not_ready  # checked and fine
        else:
            assert "broker" in not_ready, not_ready  # not checked yet: the database comes first
    finally:
        code = terminate(consumer)
    log = log_path.read_text()
    assert len(logged()) == 1, log[-2000:]  # one line per cause, not one per attempt
    # the class /readyz names is the one the log line names
    named = cause.removeprefix("unreachable (")[:-1]
    assert re.search(rf"unavailable: {named}\b", logged()[0]), (cause, log)
    assert code == 0, log[-2000:]
