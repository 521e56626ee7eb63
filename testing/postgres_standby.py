"""A PostgreSQL primary and a streaming standby of its own, for multi-host URL tests.

:func:`primary_and_standby` makes two Debian clusters (``pg_createcluster``): the primary
(``wal_level = logical``, so the logical relay runs on it) and a hot standby made from it with
``pg_basebackup -R``, which answers read-only: a URL with ``target_session_attrs=read-write``
must pass it over.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from outboxkit.testing.postgres import _free_port, _newest_postgres_version, _pg_ctlcluster, _run

PASSWORD = "postgres"
SETTINGS = (
    "listen_addresses = '127.0.0.1'\n"
    "wal_level = logical\n"
    "max_wal_senders = 10\n"
    "max_replication_slots = 10\n"
    "max_connections = 60\n"
    "shared_buffers = 16MB\n"
    "fsync = off\n"  # a test server: a crash loses nothing anyone needs
    "hot_standby = on\n"
)
HBA = (
    "local all postgres peer\n"
    "local replication postgres peer\n"
    "host all all 127.0.0.1/32 scram-sha-256\n"
    "host replication all 127.0.0.1/32 scram-sha-256\n"
)


@dataclass
class Cluster:
    """One Debian cluster: ``version``/``name`` for ``pg_ctlcluster``, listening on ``port``."""

    version: str
    name: str
    port: int

    def stop(self) -> None:
        """Stop the server (fast shutdown: open connections are closed)."""
        _pg_ctlcluster(self.version, self.name, "stop", "-m", "fast")

    def start(self) -> None:
        """Start the server again."""
        _pg_ctlcluster(self.version, self.name, "start")

    def promote(self) -> None:
        """Promote a standby to primary (a failover, once the primary is stopped)."""
        _pg_ctlcluster(self.version, self.name, "promote")

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` as the postgres superuser; return what it printed (unaligned)."""
        done = subprocess.run(
            ["runuser", "-u", "postgres", "--", "psql", "-qAt", "-p", str(self.port),
             "-d", database, "-c", sql],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout.strip()


@dataclass
class PrimaryAndStandby:
    """A primary and its streaming standby; the password of ``postgres`` is :data:`PASSWORD`."""

    primary: Cluster
    standby: Cluster
    password: str = PASSWORD

    def create_database(self, name: str) -> None:
        """Create ``name`` on the primary and wait until the standby has replayed it."""
        self.primary.psql(f'CREATE DATABASE "{name}"')
        self.wait_replayed()

    def wait_replayed(self, timeout_s: float = 60.0) -> None:
        """Wait until the standby has replayed everything the primary has written so far."""
        target = self.primary.psql("SELECT pg_current_wal_lsn()")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            caught_up = self.standby.psql(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn")
            if caught_up == "t":
                return
            time.sleep(0.1)
        raise TimeoutError(f"the standby did not replay up to {target} in {timeout_s:g} s")


@contextmanager
def primary_and_standby() -> Iterator[PrimaryAndStandby]:
    """Create and start a primary and a streaming standby of it; drop both afterwards.

    Needs root and Debian's ``postgresql-common`` (``pg_createcluster``), like
    :func:`~outboxkit.testing.postgres.tls_cluster`. Password auth on 127.0.0.1.
    """
    if os.geteuid() != 0 or shutil.which("pg_createcluster") is None:
        raise RuntimeError("primary_and_standby needs root and pg_createcluster")
    version = _newest_postgres_version()
    suffix = uuid.uuid4().hex[:8]
    primary = Cluster(version, f"pri{suffix}", _free_port())
    standby = Cluster(version, f"sby{suffix}", _free_port())
    made: list[Cluster] = []
    try:
        for cluster in (primary, standby):
            port = str(cluster.port)
            _run("pg_createcluster", version, cluster.name, "-p", port, "--", "--no-sync")
            made.append(cluster)
            config = Path("/etc/postgresql") / version / cluster.name
            (config / "conf.d" / "pair.conf").write_text(SETTINGS)
            (config / "pg_hba.conf").write_text(HBA)
        primary.start()
        primary.psql(f"ALTER USER postgres PASSWORD '{PASSWORD}'")
        data = Path("/var/lib/postgresql") / version / standby.name
        shutil.rmtree(data)
        _run(
            "runuser", "-u", "postgres", "--", "env", f"PGPASSWORD={PASSWORD}",
            f"/usr/lib/postgresql/{version}/bin/pg_basebackup", "-D", str(data), "-R",
            "-X", "stream", "-c", "fast", "-h", "127.0.0.1", "-p", str(primary.port),
            "-U", "postgres",
        )  # fmt: skip
        standby.start()
        pair = PrimaryAndStandby(primary, standby)
        if standby.psql("SELECT pg_is_in_recovery()") != "t":
            raise RuntimeError("the standby is not in recovery")
        yield pair
    finally:
        for cluster in made:
            subprocess.run(
                ["pg_dropcluster", "--stop", version, cluster.name],
                capture_output=True,
                check=False,
            )
