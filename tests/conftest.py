"""Fixtures: a real Kafka broker, throwaway PostgreSQL databases, migrated SQLite files."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from outboxkit.migrations.runner import upgrade
from outboxkit.testing.kafka import KafkaBroker, broker_from_env
from outboxkit.testing.kafka_cluster import KafkaCluster
from outboxkit.testing.pgbouncer import PgBouncer, running_pgbouncer
from outboxkit.testing.postgres import TlsCluster, server_url, throwaway_database, tls_cluster

from tests.support.kafka import broker_of_its_own

# Tests that use any of these need a real broker or PostgreSQL server: they are marked
# ``integration``, so ``pytest -m "not integration"`` is the fast lane.
INTEGRATION_FIXTURES = frozenset(
    {
        "kafka_bootstrap",
        "own_kafka",
        "kafka_cluster",
        "pg_url",
        "tls_pg",
        "pgbouncer",
        "pgbouncer_url",
        "ha_cluster",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that needs Kafka or PostgreSQL as ``integration``."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (
            INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            or params.get("db_url") == "postgresql"
        ):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The bootstrap address of a real broker: ``OUTBOXKIT_KAFKA_BOOTSTRAP`` or one we start."""
    with broker_from_env() as bootstrap:
        yield bootstrap


@pytest.fixture
def own_kafka() -> Iterator[KafkaBroker]:
    """A broker of the test's own, for tests that stop and restart it."""
    with broker_of_its_own() as broker:
        yield broker


@pytest.fixture(scope="module")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """A three-node KRaft cluster (replication factor 3, min.insync.replicas 2) for one test
    module, whose nodes its tests may kill, stop, restart and freeze (leaving them running)."""
    cluster = KafkaCluster()
    cluster.start()
    print(f"\nthree-node Kafka cluster started in {cluster.start_seconds:.1f} s")
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def tls_pg() -> Iterator[TlsCluster]:
    """A PostgreSQL cluster of the session's own that accepts TLS only, migrated; dropped after.

    Needs root and Debian's pg_createcluster (scripts/install.sh installs PostgreSQL).
    """
    if os.geteuid() != 0 or shutil.which("pg_createcluster") is None:
        pytest.skip("the TLS cluster needs root and pg_createcluster")
    with tls_cluster() as cluster:
        upgrade(f"{cluster.url}?sslmode=require")
        yield cluster


@pytest.fixture
def topic() -> str:
    """A topic name no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """URL of a fresh, migrated PostgreSQL database, dropped after the test.

    The server comes from ``OUTBOXKIT_TEST_PG_URL`` (default: postgres on 127.0.0.1:5432, which
    ``scripts/start-postgres.sh`` sets up).
    """
    with throwaway_database("outboxkit_test") as url:
        yield url


@pytest.fixture(scope="session")
def pgbouncer() -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of the test server, for the session (Debian's
    ``pgbouncer``, which scripts/install.sh installs)."""
    if shutil.which("pgbouncer") is None and not Path("/usr/sbin/pgbouncer").exists():
        pytest.skip("pgbouncer is not installed (scripts/install.sh installs it)")
    with running_pgbouncer(server_url()) as bouncer:
        yield bouncer


@pytest.fixture
def pgbouncer_url(pgbouncer: PgBouncer) -> Iterator[str]:
    """URL of a fresh, migrated PostgreSQL database reached through PgBouncer in transaction
    mode, without the ``pooler`` setting (add ``?pooler=transaction`` as the docs say); the
    database is dropped after the test."""
    with throwaway_database("outboxkit_pooled") as url:
        yield pgbouncer.url_for(url)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a fresh, migrated SQLite file."""
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test using it runs once on SQLite and once on PostgreSQL."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return request.getfixturevalue(fixture)


@pytest.fixture(scope="session")
def span_exporter() -> Any:
    """An in-memory exporter of every span finished in this process (call ``clear()`` first).

    OpenTelemetry allows one global tracer provider per process, so every test module that
    looks at spans shares this one.
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def mute_server() -> Iterator[str]:
    """A TCP server that accepts connections and never answers: a hung broker or database."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for connection in accepted:
            connection.close()
        server.close()
