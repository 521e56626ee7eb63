"""Throwaway PostgreSQL for tests and benchmarks: databases on the test server (pytest-postgresql's
janitor), and a cluster of its own that only accepts TLS (:func:`tls_cluster`)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from outboxkit.migrations.runner import upgrade
from sqlalchemy.engine import make_url

DEFAULT_SERVER_URL = "postgresql://postgres:postgres@127.0.0.1:5432/postgres"
SERVER_URL_ENV = "OUTBOXKIT_TEST_PG_URL"


def server_url() -> str:
    """The server to create databases on: ``OUTBOXKIT_TEST_PG_URL`` or the local default."""
    return os.environ.get(SERVER_URL_ENV, DEFAULT_SERVER_URL)


@contextmanager
def throwaway_database(prefix: str = "outboxkit", migrate: bool = True) -> Iterator[str]:
    """Create a fresh database (migrated unless told not to), yield its URL, then drop it.

    Dropping terminates whatever connections are still open to it.
    """
    from pytest_postgresql.janitor import DatabaseJanitor

    server = make_url(server_url())
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    janitor = DatabaseJanitor(
        user=server.username or "postgres",
        host=server.host or "127.0.0.1",
        port=server.port or 5432,
        dbname=name,
        password=server.password,
    )
    janitor.init()
    url = server.set(database=name).render_as_string(hide_password=False)
    try:
        if migrate:
            upgrade(url)
        yield url
    finally:
        drop_replication_slots(name)
        janitor.drop()


def drop_replication_slots(database: str, attempts: int = 20) -> int:
    """Drop every replication slot of ``database`` (a database with a slot cannot be dropped,
    and a slot retains WAL for ever); return how many. Connections to the database are ended
    first, so a slot a relay was reading is free to drop."""
    import time

    import psycopg

    dropped = 0
    with psycopg.connect(server_url(), autocommit=True) as conn:
        for _ in range(attempts):
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            )
            try:
                row = conn.execute(
                    "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots "
                    "WHERE database = %s",
                    (database,),
                ).fetchone()
                return dropped + int(row[0] if row else 0)
            except psycopg.errors.ObjectInUse:
                time.sleep(0.1)  # a terminated backend had not released its slot yet
    raise RuntimeError(f"could not drop the replication slots of {database}")


@dataclass
class TlsCluster:
    """A PostgreSQL cluster of its own that accepts TLS connections only (``hostssl``).

    ``url`` has no TLS parameters (add ``sslmode`` and friends); ``ca_file`` signed the
    server's certificate (for 127.0.0.1, ::1 and localhost); ``wrong_ca_file`` did not.
    :meth:`stop` and :meth:`start` take it down and up again, for outage tests.
    """

    name: str
    version: str
    port: int
    ca_file: Path
    wrong_ca_file: Path
    password: str = "postgres"

    @property
    def url(self) -> str:
        """``postgresql://postgres:...@127.0.0.1:PORT/postgres``, no TLS parameters."""
        return f"postgresql://postgres:{self.password}@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        """Stop the server (fast shutdown: open connections are closed)."""
        _pg_ctlcluster(self.version, self.name, "stop", "-m", "fast")

    def start(self) -> None:
        """Start the server again."""
        _pg_ctlcluster(self.version, self.name, "start")


@contextmanager
def tls_cluster() -> Iterator[TlsCluster]:
    """Create, start and finally drop a Debian PostgreSQL cluster that only accepts TLS.

    Needs root and Debian's ``postgresql-common`` tools (``pg_createcluster``): they run the
    server as the ``postgres`` user. The main cluster is left alone; this one has its own port,
    a server certificate from a CA made here (:mod:`outboxkit.testing.certificates`), ``ssl = on``,
    and only ``hostssl`` lines (password auth) in ``pg_hba.conf``.
    """
    from outboxkit.testing.certificates import issue_certificate, make_ca

    if os.geteuid() != 0 or shutil.which("pg_createcluster") is None:
        raise RuntimeError("tls_cluster needs root and pg_createcluster (postgresql-common)")
    version = _newest_postgres_version()
    name = f"tls{uuid.uuid4().hex[:8]}"
    port = _free_port()
    files = Path(tempfile.mkdtemp(prefix="outboxkit-pgtls-"))
    files.chmod(0o755)
    ca = make_ca(files, "outboxkit test CA")
    wrong = make_ca(files, "some other CA")
    cert_file, key_file = issue_certificate(ca, files)
    for path in (cert_file, key_file):
        shutil.chown(path, "postgres", "postgres")
    cluster = TlsCluster(name, version, port, ca.cert_file, wrong.cert_file)
    _run("pg_createcluster", version, name, "-p", str(port))
    try:
        config = Path("/etc/postgresql") / version / name
        (config / "conf.d" / "tls.conf").write_text(
            "listen_addresses = '127.0.0.1,::1'\n"
            "ssl = on\n"
            f"ssl_cert_file = '{cert_file}'\n"
            f"ssl_key_file = '{key_file}'\n"
            "max_connections = 40\n"
            "shared_buffers = 16MB\n"
        )
        (config / "pg_hba.conf").write_text(
            "local all postgres peer\n"
            "hostssl all all 127.0.0.1/32 scram-sha-256\n"
            "hostssl all all ::1/128 scram-sha-256\n"
        )
        cluster.start()
        sql = f"ALTER USER postgres PASSWORD '{cluster.password}'"
        _as_postgres("psql", "-q", "-p", str(port), "-c", sql)
        yield cluster
    finally:
        subprocess.run(
            ["pg_dropcluster", "--stop", version, name], capture_output=True, check=False
        )
        shutil.rmtree(files, ignore_errors=True)


def _newest_postgres_version() -> str:
    versions = [p.name for p in Path("/usr/lib/postgresql").iterdir() if p.name.isdigit()]
    if not versions:
        raise RuntimeError("no PostgreSQL server under /usr/lib/postgresql")
    return max(versions, key=int)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _pg_ctlcluster(version: str, name: str, *args: str) -> None:
    _run("pg_ctlcluster", "--skip-systemctl-redirect", version, name, *args)


def _run(*command: str, env: dict[str, str] | None = None) -> str:
    """Run ``command``; return what it printed, stripped. Raises :class:`RuntimeError` naming
    the command, with its error output."""
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _as_postgres(*command: str, password: str | None = None) -> str:
    """:func:`_run` ``command`` as the ``postgres`` user (``PGPASSWORD`` set to ``password``
    if given)."""
    env = {**os.environ, "PGPASSWORD": password} if password is not None else None
    return _run("runuser", "-u", "postgres", "--", *command, env=env)
