"""docker-compose.yml's PostgreSQL runs with what ``relay --mode logical`` needs: ``wal_level``
logical (``require_logical`` refuses anything else), replication slots and WAL senders, and a
pg_hba line for the stream reader's replication connection. No Docker engine here: the file
is parsed and its init script checked; the `cluster` profile is the three-node cluster of
``outboxkit dev kafka --brokers 3``."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml
from outboxkit.testing.kafka_cluster import KafkaCluster

from tests.support import REPO


def postgres_service() -> dict[str, object]:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    service: dict[str, object] = compose["services"]["postgres"]
    return service


def settings(command: list[str]) -> dict[str, str]:
    assert command[0] == "postgres"
    pairs = command[1:]
    assert pairs[::2] == ["-c"] * (len(pairs) // 2), command
    return dict(setting.split("=", 1) for setting in pairs[1::2])


def test_compose_postgres_runs_with_logical_decoding() -> None:
    given = settings(postgres_service()["command"])  # type: ignore[arg-type]
    assert given["wal_level"] == "logical"
    assert int(given["max_replication_slots"]) >= 1
    assert int(given["max_wal_senders"]) >= 1


def test_compose_postgres_allows_replication_connections() -> None:
    volumes = postgres_service()["volumes"]
    assert isinstance(volumes, list)
    scripts = [
        REPO / source.removeprefix("./")
        for source, target, *_ in (volume.split(":") for volume in volumes)
        if target.startswith("/docker-entrypoint-initdb.d/")
    ]
    (script,) = scripts
    assert Path(script).is_file()
    assert "host replication all all scram-sha-256" in script.read_text()


def cluster_nodes() -> dict[str, dict[str, object]]:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return {
        name: service
        for name, service in compose["services"].items()
        if "cluster" in service.get("profiles", [])
    }


def test_compose_cluster_profile_is_the_three_node_cluster_of_dev_kafka() -> None:
    nodes = cluster_nodes()
    assert sorted(nodes) == ["kafka-1", "kafka-2", "kafka-3"]
    env = {name: node["environment"] for name, node in nodes.items()}
    ids = {name: int(given["KAFKA_NODE_ID"]) for name, given in env.items()}  # type: ignore[index]
    assert sorted(ids.values()) == [1, 2, 3]
    voters = {given["KAFKA_CONTROLLER_QUORUM_VOTERS"] for given in env.values()}  # type: ignore[index]
    (quorum,) = voters  # one list shared by all
    assert sorted(quorum.split(",")) == [f"{ids[name]}@{name}:9093" for name in sorted(ids)]
    (cluster_id,) = {given["CLUSTER_ID"] for given in env.values()}  # type: ignore[index]
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16  # a KRaft cluster id
    layout = KafkaCluster()
    try:
        launcher = layout.nodes[0]
        for given in env.values():
            assert given["KAFKA_PROCESS_ROLES"] == "broker,controller"  # type: ignore[index]
            assert int(given["KAFKA_DEFAULT_REPLICATION_FACTOR"]) == launcher.replication == 3  # type: ignore[index]
            assert int(given["KAFKA_MIN_INSYNC_REPLICAS"]) == launcher.min_insync == 2  # type: ignore[index]
            assert int(given["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == 3  # type: ignore[index]
            assert int(given["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"]) == 3  # type: ignore[index]
            assert int(given["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) == 2  # type: ignore[index]
    finally:
        layout.close()


def test_compose_cluster_nodes_advertise_the_ports_they_publish() -> None:
    bootstrap = []
    for name, node in sorted(cluster_nodes().items()):
        (published,) = node["ports"]  # type: ignore[misc]
        host, host_port, container_port = published.split(":")
        assert host == "127.0.0.1" and host_port == container_port
        env = node["environment"]
        advertised = env["KAFKA_ADVERTISED_LISTENERS"]  # type: ignore[index]
        assert f"PLAINTEXT://127.0.0.1:{host_port}" in advertised.split(",")
        assert f"INTERNAL://{name}:" in advertised
        assert f"PLAINTEXT://0.0.0.0:{host_port}" in env["KAFKA_LISTENERS"]  # type: ignore[index]
        bootstrap.append(f"127.0.0.1:{host_port}")
    # The address the docs give is the one the profile serves.
    assert ",".join(bootstrap) in (REPO / "docs" / "testing.md").read_text()
