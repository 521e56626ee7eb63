"""PostgreSQL high availability the way users deploy it, from Debian's packages, on 127.0.0.1.

:func:`patroni_cluster` starts a single-node etcd, two Patroni nodes (a primary and a streaming
replica that Patroni bootstraps with ``pg_basebackup``; synchronous replication, so a commit the
client saw survives a failover) and HAProxy routing one port to whichever node answers
Patroni's ``/primary`` health check. Clients reach the primary the two ways users do:
:attr:`PatroniCluster.url_haproxy` and :attr:`PatroniCluster.url_multihost` (libpq's
``h1:p1,h2:p2`` with ``target_session_attrs=read-write``).

:meth:`PatroniCluster.switchover` asks Patroni to move the primary (planned maintenance);
:meth:`PatroniCluster.failover` kill -9s the primary's postmaster: Patroni
(``primary_start_timeout: 0``) hands the lock to the replica, then rejoins the old primary as a
replica with ``pg_rewind``. Every step waits on a condition with a deadline.

Needs root (PostgreSQL runs as the ``postgres`` user: initdb refuses root), Debian's
``patroni`` (run by Debian's ``/usr/bin/python3`` with ``python3-etcd`` and ``python3-psycopg2``),
``etcd-server``, ``haproxy`` and PostgreSQL's binaries; ``scripts/install.sh`` installs them.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from outboxkit.testing.kafka import free_port

PG_BIN_DIR = Path("/usr/lib/postgresql/15/bin")
PATRONI = "/usr/bin/patroni"
SYSTEM_PYTHON = "/usr/bin/python3"
PASSWORD = "postgres"  # a throwaway cluster's superuser, on loopback only
READY_TIMEOUT_S = 120.0
ROLE_TIMEOUT_S = 90.0
POLL_S = 0.1

T = TypeVar("T")


class PatroniError(RuntimeError):
    """The cluster could not be started or did not reach the state asked for; says why."""


def missing_tools() -> list[str]:
    """What this machine lacks to run :func:`patroni_cluster` (empty when it can)."""
    wanted = {
        "root": os.geteuid() == 0,
        "patroni": Path(PATRONI).exists(),
        "etcd": shutil.which("etcd") is not None,
        "haproxy": shutil.which("haproxy") is not None,
        "PostgreSQL 15 binaries": (PG_BIN_DIR / "postgres").exists(),
    }
    return [name for name, present in wanted.items() if not present]


@dataclass
class PatroniNode:
    """One Patroni-managed PostgreSQL server."""

    name: str
    pg_port: int
    api_port: int
    home: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def log_file(self) -> Path:
        return self.home / "patroni.log"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def answers(self, check: str) -> bool:
        """Whether Patroni's REST health check ``check`` (``primary``, ``replica``, ``sync``,
        ``health``) answers 200 on this node right now."""
        try:
            with urllib.request.urlopen(f"{self.api}/{check}", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid, from ``postmaster.pid``; ``None`` when there is none."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        return pid


@dataclass
class PatroniCluster:
    """A running two-node Patroni cluster behind HAProxy; see the module's docstring.

    ``timings`` records how long each step took (seconds): ``start``, and a list per
    ``switchover`` and ``failover`` (until the old primary streams from the new one again) and
    per ``switchover_writable`` and ``failover_writable`` (until the new primary takes writes
    through HAProxy).
    """

    home: Path
    scope: str
    database: str
    etcd_port: int
    haproxy_port: int
    nodes: list[PatroniNode]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    timings: dict[str, list[float]] = field(default_factory=dict)

    @property
    def url_haproxy(self) -> str:
        """The database through HAProxy, which routes to the current primary."""
        return self.haproxy_url(self.database)

    @property
    def url_multihost(self) -> str:
        """The database through libpq's multi-host form, ``read-write`` so only the primary."""
        return self.multihost_url(self.database)

    def haproxy_url(self, database: str) -> str:
        """:attr:`url_haproxy` for another database of the cluster."""
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.haproxy_port}/{database}"

    def multihost_url(self, database: str) -> str:
        """:attr:`url_multihost` for another database of the cluster."""
        hosts = ",".join(f"127.0.0.1:{node.pg_port}" for node in self.nodes)
        return (
            f"postgresql://postgres:{PASSWORD}@{hosts}/{database}?target_session_attrs=read-write"
        )

    def create_database(self, database: str) -> str:
        """Create ``database`` on the primary; return its :meth:`haproxy_url`."""
        _create_database(self.node_url(self.primary(), "postgres"), database)
        return self.haproxy_url(database)

    def node_url(self, node: PatroniNode, database: str | None = None) -> str:
        """The database on one node, directly."""
        name = database or self.database
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{node.pg_port}/{name}"

    def primary(self) -> PatroniNode:
        """The node that leads now (waits, up to the role deadline, while there is none)."""
        leader = _wait_for(self._leader, lambda node: node is not None, ROLE_TIMEOUT_S, "a primary")
        assert leader is not None
        return leader

    def replica(self) -> PatroniNode:
        """The node that does not lead now."""
        leader = self.primary()
        return next(node for node in self.nodes if node is not leader)

    def switchover(self) -> PatroniNode:
        """Move the primary to the replica through Patroni's REST API (``POST /switchover``);
        return the new primary once it takes writes through HAProxy and the old one streams
        from it synchronously."""
        began = time.monotonic()
        old, new = self.primary(), self.replica()
        body = json.dumps({"leader": old.name, "candidate": new.name}).encode()
        request = urllib.request.Request(
            f"{old.api}/switchover", data=body, method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                raise PatroniError(f"switchover refused: {response.read().decode()[:300]}")
        self._settle(new, old, "switchover", began)
        self.timings.setdefault("switchover", []).append(time.monotonic() - began)
        return new

    def failover(self) -> PatroniNode:
        """Crash the primary (:meth:`crash_primary`): Patroni promotes the replica and
        rewinds the old primary into a replica. Returns the new primary once it takes writes
        through HAProxy and the old one streams from it synchronously."""
        began = time.monotonic()
        new = self.replica()
        old = self.crash_primary()
        self._settle(new, old, "failover", began)
        self.timings.setdefault("failover", []).append(time.monotonic() - began)
        return new

    def crash_primary(self) -> PatroniNode:
        """kill -9 the primary's postmaster and return at once (the node that led); the
        cluster fails over by itself, :meth:`wait_healthy` waits for it to settle."""
        old = self.primary()
        pid = old.postmaster_pid()
        if pid is None:
            raise PatroniError(f"{old.name} has no running postmaster to kill")
        os.kill(pid, signal.SIGKILL)
        return old

    def wait_healthy(self, timeout_s: float = ROLE_TIMEOUT_S) -> PatroniNode:
        """Wait until one node leads and takes writes through HAProxy, and the other is its
        synchronous standby; return the leader."""

        def leader_if_healthy() -> PatroniNode | None:
            leader = self._leader()
            if leader is None:
                return None
            other = next(node for node in self.nodes if node is not leader)
            routed = _server_port(self.haproxy_url("postgres")) == leader.pg_port
            return leader if routed and other.answers("sync") else None

        try:
            leader = _wait_for(leader_if_healthy, lambda n: n is not None, timeout_s, "health")
        except PatroniError as error:
            raise PatroniError(f"{error}\n{self._log_tails()}") from None
        assert leader is not None
        return leader

    def close(self) -> None:
        """Kill every process (Patroni, PostgreSQL, etcd, HAProxy) and remove the files."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.kill()
                node.process.wait()
            pid = node.postmaster_pid()
            if pid is not None:
                _kill_and_wait(pid)
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        shutil.rmtree(self.home, ignore_errors=True)

    def _leader(self) -> PatroniNode | None:
        leaders = [node for node in self.nodes if node.answers("primary")]
        return leaders[0] if len(leaders) == 1 else None

    def _settle(self, leader: PatroniNode, follower: PatroniNode, step: str, began: float) -> None:
        """Wait until ``leader`` takes writes through HAProxy (recorded as ``STEP_writable``,
        seconds since ``began``), then until ``follower`` is its synchronous standby."""
        timeout_s = ROLE_TIMEOUT_S

        def writable() -> bool:
            port = _server_port(self.haproxy_url("postgres"))
            return leader.answers("primary") and port == leader.pg_port

        try:
            _wait_for(writable, bool, timeout_s, f"{step}: {leader.name} taking writes")
            self.timings.setdefault(f"{step}_writable", []).append(time.monotonic() - began)
            _wait_for(
                lambda: follower.answers("sync"),
                bool,
                timeout_s,
                f"{step}: {follower.name} in sync",
            )
        except PatroniError as error:
            raise PatroniError(f"{error}\n{self._log_tails()}") from None

    def _log_tails(self) -> str:
        logs = [(node.name, node.log_file) for node in self.nodes]
        logs += [(name, self.home / f"{name}.log") for name in ("haproxy", "etcd")]
        return "\n".join(f"--- {name}:\n{_tail(path)}" for name, path in logs)


@contextmanager
def patroni_cluster(database: str = "outboxkit") -> Iterator[PatroniCluster]:
    """Start etcd, two Patroni nodes and HAProxy from a temporary folder on free loopback ports;
    create ``database``; yield the :class:`PatroniCluster`; kill everything and remove the files
    afterwards, whatever happened."""
    missing = missing_tools()
    if missing:
        raise PatroniError(f"patroni_cluster needs {', '.join(missing)} (scripts/install.sh)")
    began = time.monotonic()
    home = Path(tempfile.mkdtemp(prefix="outboxkit-patroni-"))
    home.chmod(0o755)
    scope = f"outboxkit-{uuid.uuid4().hex[:8]}"
    nodes = [
        PatroniNode(f"pg{index}", free_port(), free_port(), home / f"pg{index}") for index in (1, 2)
    ]
    cluster = PatroniCluster(home, scope, database, free_port(), free_port(), nodes)
    try:
        cluster.processes.append(_start_etcd(cluster))
        _wait_for(
            lambda: _http_ok(f"http://127.0.0.1:{cluster.etcd_port}/health"),
            bool, READY_TIMEOUT_S, "etcd",
        )  # fmt: skip
        for node in nodes:  # together: one wins the initialize key, the other base-backs up
            node.process = _start_patroni(cluster, node)
        cluster.processes.append(_start_haproxy(cluster))
        cluster.wait_healthy(READY_TIMEOUT_S)
        cluster.create_database(database)
        cluster.timings["start"] = [time.monotonic() - began]
        yield cluster
    finally:
        cluster.close()


def _start_etcd(cluster: PatroniCluster) -> subprocess.Popen[bytes]:
    peer = f"http://127.0.0.1:{free_port()}"
    client = f"http://127.0.0.1:{cluster.etcd_port}"
    return _spawn(
        [
            "etcd", "--name", "etcd1", "--data-dir", str(cluster.home / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"etcd1={peer}", "--initial-cluster-state", "new",
            "--log-level", "warn",
        ],
        cluster.home / "etcd.log",
    )  # fmt: skip


def _start_haproxy(cluster: PatroniCluster) -> subprocess.Popen[bytes]:
    servers = "\n".join(
        f"  server {node.name} 127.0.0.1:{node.pg_port} check port {node.api_port}"
        for node in cluster.nodes
    )
    config = cluster.home / "haproxy.cfg"
    # Patroni's documented HAProxy setup: a TCP proxy whose health check is the node's REST
    # API (200 on /primary only for the leader); sessions to a node marked down are cut, so
    # clients reconnect to the new primary instead of lingering on a demoted server. OPTIONS:
    # Patroni answers it with the status line only, which is all HAProxy reads.
    config.write_text(
        "global\n  maxconn 500\n"
        "defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 30m\n"
        "  timeout server 30m\n  timeout check 2s\n"
        f"listen primary\n  bind 127.0.0.1:{cluster.haproxy_port}\n"
        "  option httpchk\n  http-check send meth OPTIONS uri /primary\n"
        "  http-check expect status 200\n"
        "  default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions\n"
        f"{servers}\n"
    )
    return _spawn(["haproxy", "-db", "-f", str(config)], cluster.home / "haproxy.log")


def _start_patroni(cluster: PatroniCluster, node: PatroniNode) -> subprocess.Popen[bytes]:
    postgres = pwd.getpwnam("postgres")
    node.home.mkdir(mode=0o700)
    os.chown(node.home, postgres.pw_uid, postgres.pw_gid)
    config = node.home / "patroni.yml"
    config.write_text(json.dumps(_patroni_config(cluster, node), indent=1))  # JSON is YAML
    os.chown(config, postgres.pw_uid, postgres.pw_gid)
    log = open(node.log_file, "ab")  # noqa: SIM115 - the child writes to it
    try:
        return subprocess.Popen(
            [SYSTEM_PYTHON, PATRONI, str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            user=postgres.pw_uid,
            group=postgres.pw_gid,
            extra_groups=[],
            cwd=node.home,
            env={"PATH": "/usr/bin:/bin", "HOME": str(node.home), "LANG": "C.UTF-8"},
            start_new_session=True,
        )
    finally:
        log.close()


# The name of Patroni's configuration section for PostgreSQL (a YAML key, not a dialect check:
# tests/dialects/test_no_dialect_branches.py reads literal keys as branches on a database name).
_POSTGRESQL_SECTION = "postgresql"


def _patroni_config(cluster: PatroniCluster, node: PatroniNode) -> dict[str, object]:
    address = "127.0.0.1"
    return {
        "scope": cluster.scope,
        "namespace": "/outboxkit/",
        "name": node.name,
        "log": {"level": "INFO"},
        "restapi": {
            "listen": f"{address}:{node.api_port}",
            "connect_address": f"{address}:{node.api_port}",
        },
        "etcd3": {"hosts": [f"{address}:{cluster.etcd_port}"]},
        "bootstrap": {
            "dcs": {
                # Short loops so a test sees a role change in about a second; the TTL leaves
                # room for a busy machine before a lock would expire.
                "ttl": 15,
                "loop_wait": 1,
                "retry_timeout": 5,
                "maximum_lag_on_failover": 1048576,
                "primary_start_timeout": 0,
                "synchronous_mode": True,
                _POSTGRESQL_SECTION: {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {
                        "wal_level": "logical",
                        "max_replication_slots": 20,
                        "max_wal_senders": 20,
                        "wal_log_hints": "on",
                        "hot_standby": "on",
                        "max_connections": 200,
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, "no-sync"],
            "pg_hba": [
                "local all all trust",
                f"host replication replicator {address}/32 scram-sha-256",
                f"host all all {address}/32 scram-sha-256",
            ],
        },
        _POSTGRESQL_SECTION: {
            "listen": f"{address}:{node.pg_port}",
            "connect_address": f"{address}:{node.pg_port}",
            "data_dir": str(node.data_dir),
            "bin_dir": str(PG_BIN_DIR),
            "pgpass": str(node.home / "pgpass"),
            "authentication": {
                "superuser": {"username": "postgres", "password": PASSWORD},
                "replication": {"username": "replicator", "password": PASSWORD},
                "rewind": {"username": "postgres", "password": PASSWORD},
            },
            "basebackup": [{"checkpoint": "fast"}],
            "parameters": {
                "unix_socket_directories": str(node.home),
                # Process kills are the faults here, not power cuts: the OS keeps what was
                # written, so skipping fsync loses nothing and saves seconds on a busy disk.
                "fsync": "off",
                "shared_buffers": "32MB",
            },
        },
        "tags": {"nofailover": False, "noloadbalance": False},
    }


def _spawn(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    log = open(log_path, "ab")  # noqa: SIM115 - the child writes to it
    try:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    finally:
        log.close()


def _create_database(server_url: str, database: str) -> None:
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')


def _server_port(url: str) -> int | None:
    """The port of the server a connection to ``url`` reaches and that takes writes."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            row = conn.execute("SELECT inet_server_port(), pg_is_in_recovery()").fetchone()
    except psycopg.Error:
        return None
    if row is None or row[1]:
        return None
    return int(row[0])


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _kill_and_wait(pid: int, timeout_s: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(POLL_S)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_for(
    probe: Callable[[], T], done: Callable[[T], object], timeout_s: float, what: str
) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() >= deadline:
            raise PatroniError(f"no {what} after {timeout_s:g} s (last: {value!r})")
        time.sleep(POLL_S)
