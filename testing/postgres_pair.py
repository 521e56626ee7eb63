"""A PostgreSQL primary and a streaming standby behind one address, for failover tests.

:func:`failover_pair` makes two Debian clusters (``pg_createcluster``, ``wal_level=logical``),
the standby a ``pg_basebackup -R`` copy of the primary, and a TCP front door
(:class:`FrontDoor`) that forwards every client to the current primary, as a virtual IP or an
HAProxy routing by health check would. :meth:`FailoverPair.promote` stops the primary
(immediate shutdown: a crash), promotes the standby and points the front door at it, closing
the connections it carried; :meth:`FailoverPair.add_standby` makes a new standby of the
current primary. Each :class:`Cluster` is also at hand on its own (its port and URL, ``stop``,
``start``, ``psql``, ``promote`` leaving the front door alone), for tests that list the hosts
in a URL themselves (tests/outbox/test_multi_host.py). Logical slots are not copied to a
standby before PostgreSQL 17, so a promotion takes them: what the relay must notice
(docs/relay.md, "Failover").

Needs root and ``postgresql-common`` (the servers run as the ``postgres`` user).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from outboxkit.testing.postgres import (
    _as_postgres,
    _free_port,
    _newest_postgres_version,
    _pg_ctlcluster,
    _run,
)

PASSWORD = "postgres"


class FrontDoor:
    """A TCP forwarder on ``127.0.0.1:port`` to ``127.0.0.1:target`` (a thread per direction
    of each connection). :meth:`switch` points it elsewhere and closes what it carried."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="front-door", daemon=True).start()

    def switch(self, target: int) -> None:
        """Forward new connections to ``target``; close the current ones."""
        with self._lock:
            self.target = target
            carried, self._open = self._open, set()
        for sock in carried:
            _close(sock)

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._closed = True
        _close(self._listener)
        self.switch(self.target)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                server.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open.update((client, server))
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


@dataclass
class Cluster:
    """One Debian cluster: ``version``/``name`` for ``pg_ctlcluster``, listening on ``port``."""

    version: str
    name: str
    port: int

    def url(self, database: str = "postgres") -> str:
        """A URL of this cluster alone (not through the front door)."""
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        """Start the server."""
        _pg_ctlcluster(self.version, self.name, "start")

    def stop(self, *, crash: bool = False) -> None:
        """Stop the server: a fast shutdown (open connections are closed), or with ``crash``
        an immediate one (no shutdown checkpoint, as if the host died)."""
        _pg_ctlcluster(self.version, self.name, "stop", "-m", "immediate" if crash else "fast")

    def promote(self) -> None:
        """Ask a standby to become a primary; :meth:`in_recovery` turns false when it has.
        Whatever points clients at it (the pair's front door) is left as it is."""
        _pg_ctlcluster(self.version, self.name, "promote")

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` as the postgres superuser; return what it printed (unaligned)."""
        return _as_postgres("psql", "-XAtq", "-p", str(self.port), "-d", database, "-c", sql)

    def in_recovery(self) -> bool | None:
        """Whether the server is a standby; ``None`` while it does not answer."""
        try:
            return self.psql("SELECT pg_is_in_recovery()") == "t"
        except RuntimeError:
            return None


@dataclass
class FailoverPair:
    """A primary, its standbys and the :class:`FrontDoor` clients connect through."""

    version: str
    primary: Cluster  # the current primary
    door: FrontDoor
    standbys: list[Cluster] = field(default_factory=list)
    clusters: list[Cluster] = field(default_factory=list)  # every cluster made (to drop)

    def url(self, database: str = "postgres") -> str:
        """The front door's URL (always the current primary)."""
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.door.port}/{database}"

    def add_standby(self) -> Cluster:
        """Make a new streaming standby of the current primary and return it."""
        name = f"{self.primary.name.rsplit('_', 1)[0]}_{len(self.clusters)}"
        standby = Cluster(self.version, name, _free_port())
        self.clusters.append(standby)
        _create(standby)
        data = Path("/var/lib/postgresql") / self.version / name
        shutil.rmtree(data)
        _as_postgres(
            "pg_basebackup", "-D", str(data), "-R", "-X", "stream", "-c", "fast", "--no-sync",
            "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
            password=PASSWORD,
        )  # fmt: skip
        standby.start()
        self.standbys.append(standby)
        _wait_for(lambda: standby.in_recovery() is True, f"standby {name} streaming")
        return standby

    def promote(self, *, open_door: bool = True) -> Cluster:
        """Crash the primary (immediate shutdown), promote the first standby and (unless
        ``open_door`` is false: then clients reach nothing until :meth:`open_door`) point the
        front door at it; return it. The old primary stays down."""
        new = self.standbys.pop(0)
        self.primary.stop(crash=True)
        new.promote()
        _wait_for(lambda: new.in_recovery() is False, f"{new.name} promoted")
        self.primary = new
        if open_door:
            self.open_door()
        return new

    def open_door(self) -> None:
        """Point the front door at the current primary."""
        self.door.switch(self.primary.port)

    def create_database(self, name: str) -> None:
        """Create ``name`` on the primary and wait until every standby has replayed it."""
        self.primary.psql(f'CREATE DATABASE "{name}"')
        self.wait_replayed()

    def wait_replayed(self) -> None:
        """Wait until every standby replayed the primary's WAL as of now."""
        target = self.primary.psql("SELECT pg_current_wal_insert_lsn()")
        sql = f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"
        for standby in self.standbys:

            def replayed(standby: Cluster = standby) -> bool:
                return standby.psql(sql) == "t"

            _wait_for(replayed, f"{standby.name} replayed {target}")

    def drop(self) -> None:
        """Close the front door and drop every cluster."""
        self.door.close()
        for cluster in self.clusters:
            subprocess.run(
                ["pg_dropcluster", "--stop", self.version, cluster.name],
                capture_output=True,
                check=False,
            )


@contextmanager
def failover_pair() -> Iterator[FailoverPair]:
    """A primary and one streaming standby (``wal_level=logical``), yielded, then dropped."""
    if os.geteuid() != 0 or shutil.which("pg_createcluster") is None:
        raise RuntimeError("failover_pair needs root and pg_createcluster (postgresql-common)")
    version = _newest_postgres_version()
    primary = Cluster(version, f"fo{uuid.uuid4().hex[:8]}_0", _free_port())
    pair = FailoverPair(version, primary, FrontDoor(primary.port))
    try:
        pair.clusters.append(primary)
        _create(primary)
        primary.start()
        primary.psql(f"ALTER USER postgres PASSWORD '{PASSWORD}'")
        pair.add_standby()
        yield pair
    finally:
        pair.drop()


def _create(cluster: Cluster) -> None:
    """``pg_createcluster`` with the pair's settings; not started."""
    _run(
        "pg_createcluster",
        cluster.version,
        cluster.name,
        "-p",
        str(cluster.port),
        "--",
        "--no-sync",
    )
    config = Path("/etc/postgresql") / cluster.version / cluster.name
    (config / "conf.d" / "failover.conf").write_text(
        "listen_addresses = '127.0.0.1'\n"
        "wal_level = logical\n"
        "max_wal_senders = 10\n"
        "max_replication_slots = 10\n"
        "wal_keep_size = 256MB\n"
        "hot_standby = on\n"
        "max_connections = 60\n"
        "shared_buffers = 32MB\n"
        "fsync = off\n"
        "full_page_writes = off\n"
    )
    (config / "pg_hba.conf").write_text(
        "local all postgres peer\n"
        "local replication postgres peer\n"
        "host all all 127.0.0.1/32 scram-sha-256\n"
        "host replication all 127.0.0.1/32 scram-sha-256\n"
    )


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    pause = 0.05
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(pause)
        pause = min(1.0, pause * 2)
