"""docker-compose.yml's PostgreSQL runs with what ``relay --mode logical`` needs: ``wal_level``
logical (``require_logical`` refuses anything else), replication slots and WAL senders, and a
pg_hba line for the stream reader's replication connection. No Docker engine here: the file
is parsed and its init script checked."""

from __future__ import annotations

from pathlib import Path

import yaml

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
