"""A PostgreSQL primary and a streaming standby behind one address, for failover tests.

:func:`failover_pair` makes two Debian clusters (``pg_createcluster``, ``wal_level=logical``),
the standby a ``pg_basebackup -R`` copy of the primary, and a TCP front door
(:class:`FrontDoor`) that forwards every client to the current primary, as a virtual IP or an
HAProxy routing by health check would. :meth:`FailoverPair.promote` stops the primary
(immediate shutdown: a crash), promotes the standby and points the front door at it, closing
the connections it carried; :meth:`FailoverPair.add_standby` makes a new standby of the
current primary. Logical slots are not copied to a standby before PostgreSQL 17, so a
promotion takes them: what the relay must notice (docs/relay.md, "Failover").

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

from outboxkit.testing.postgres import _free_port, _newest_postgres_version, _pg_ctlcluster, _run

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
class FailoverPair:
    """A primary, its standbys and the :class:`FrontDoor` clients connect through."""

    version: str
    primary: str  # the current primary's cluster name
    ports: dict[str, int]  # cluster name -> port
    door: FrontDoor
    standbys: list[str] = field(default_factory=list)
    clusters: list[str] = field(default_factory=list)  # every cluster made (to drop)

    def url(self, database: str = "postgres") -> str:
        """The front door's URL (always the current primary)."""
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.door.port}/{database}"

    def direct_url(self, cluster: str, database: str = "postgres") -> str:
        """A URL of one cluster, not through the front door."""
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.ports[cluster]}/{database}"

    def add_standby(self) -> str:
        """Make a new streaming standby of the current primary; return its cluster name."""
        name = f"{self.primary.rsplit('_', 1)[0]}_{len(self.clusters)}"
        port = _free_port()
        _run("pg_createcluster", self.version, name, "-p", str(port), "--", "--no-sync")
        self.clusters.append(name)
        self.ports[name] = port
        _configure(self.version, name)
        data = Path("/var/lib/postgresql") / self.version / name
        shutil.rmtree(data)
        _as_postgres(
            "pg_basebackup", "-D", str(data), "-R", "-X", "stream", "-c", "fast", "--no-sync",
            "-h", "127.0.0.1", "-p", str(self.ports[self.primary]), "-U", "postgres",
        )  # fmt: skip
        _pg_ctlcluster(self.version, name, "start")
        self.standbys.append(name)
        _wait_for(lambda: _in_recovery(port) is True, f"standby {name} streaming")
        return name

    def promote(self, *, open_door: bool = True) -> str:
        """Crash the primary (immediate shutdown), promote the first standby and (unless
        ``open_door`` is false: then clients reach nothing until :meth:`open_door`) point the
        front door at it; return its cluster name. The old primary stays down."""
        new = self.standbys.pop(0)
        _pg_ctlcluster(self.version, self.primary, "stop", "-m", "immediate")
        _pg_ctlcluster(self.version, new, "promote")
        _wait_for(lambda: _in_recovery(self.ports[new]) is False, f"{new} promoted")
        self.primary = new
        if open_door:
            self.open_door()
        return new

    def open_door(self) -> None:
        """Point the front door at the current primary."""
        self.door.switch(self.ports[self.primary])

    def wait_replayed(self) -> None:
        """Wait until every standby replayed the primary's WAL as of now."""
        target = _query(self.ports[self.primary], "SELECT pg_current_wal_insert_lsn()")
        for name in self.standbys:
            port = self.ports[name]

            def replayed(port: int = port) -> bool:
                sql = f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"
                return _query(port, sql) == "t"

            _wait_for(replayed, f"{name} replayed {target}")

    def drop(self) -> None:
        """Close the front door and drop every cluster."""
        self.door.close()
        for name in self.clusters:
            subprocess.run(
                ["pg_dropcluster", "--stop", self.version, name], capture_output=True, check=False
            )


@contextmanager
def failover_pair() -> Iterator[FailoverPair]:
    """A primary and one streaming standby (``wal_level=logical``), yielded, then dropped."""
    if os.geteuid() != 0 or shutil.which("pg_createcluster") is None:
        raise RuntimeError("failover_pair needs root and pg_createcluster (postgresql-common)")
    version = _newest_postgres_version()
    primary = f"fo{uuid.uuid4().hex[:8]}_0"
    port = _free_port()
    pair = FailoverPair(version, primary, {primary: port}, FrontDoor(port), clusters=[primary])
    try:
        _run("pg_createcluster", version, primary, "-p", str(port), "--", "--no-sync")
        _configure(version, primary)
        _pg_ctlcluster(version, primary, "start")
        _as_postgres(
            "psql", "-q", "-p", str(port), "-c", f"ALTER USER postgres PASSWORD '{PASSWORD}'"
        )
        pair.add_standby()
        yield pair
    finally:
        pair.drop()


def _configure(version: str, name: str) -> None:
    config = Path("/etc/postgresql") / version / name
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


def _as_postgres(*command: str) -> None:
    env = {**os.environ, "PGPASSWORD": PASSWORD}
    done = subprocess.run(
        ["runuser", "-u", "postgres", "--", *command],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} failed: {done.stderr.strip()}")


def _query(port: int, sql: str) -> str | None:
    done = subprocess.run(
        ["runuser", "-u", "postgres", "--", "psql", "-XAtq", "-p", str(port), "-c", sql],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def _in_recovery(port: int) -> bool | None:
    answer = _query(port, "SELECT pg_is_in_recovery()")
    return None if answer is None else answer == "t"


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    pause = 0.05
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(pause)
        pause = min(1.0, pause * 2)
