"""PgBouncer in transaction mode in front of a PostgreSQL server, for tests: Debian's
``pgbouncer`` (scripts/install.sh installs it) in a temporary folder of its own, on a free port.

Every transaction may run on another server connection, as in production behind a transaction
pooler: the pool is small (:data:`POOL_SIZE` server connections per database and user), handed
out in turn (``server_round_robin``), so once :meth:`PgBouncer.fill_pool` has opened them all,
a client's consecutive transactions run on different ones, as under a busy application's load.
PgBouncer refuses to run as root: started by root it runs as the ``postgres`` user
(``-u postgres``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from outboxkit.testing.postgres import _free_port
from sqlalchemy.engine import make_url

POOL_SIZE = 5
"""Server connections per database and user: few, so a client's transactions really hop."""
RUN_AS = "postgres"
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class PgBouncer:
    """A running PgBouncer: ``port`` on 127.0.0.1, in front of ``server_url``'s server."""

    port: int
    server_url: str
    folder: Path

    def url_for(self, database_url: str) -> str:
        """``database_url`` (a database on the server) reached through this PgBouncer; the
        URL carries no ``pooler`` setting (add ``?pooler=transaction`` as users must)."""
        url = make_url(database_url).set(host="127.0.0.1", port=self.port)
        return url.render_as_string(hide_password=False)

    async def fill_pool(self, database_url: str) -> None:
        """Make PgBouncer open every server connection of ``database_url``'s pool (each of
        :data:`POOL_SIZE` clients holding one at once), so that the next transactions rotate
        over them."""
        import asyncio

        import asyncpg

        url = make_url(self.url_for(database_url)).set(drivername="postgresql", query={})
        dsn = url.render_as_string(hide_password=False)
        clients = [await asyncpg.connect(dsn, statement_cache_size=0) for _ in range(POOL_SIZE)]
        try:
            await asyncio.gather(*(c.execute("SELECT pg_sleep(0.2)") for c in clients))
        finally:
            await asyncio.gather(*(c.close() for c in clients))

    @property
    def log_text(self) -> str:
        """PgBouncer's log so far (for a failing test's message)."""
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextmanager
def running_pgbouncer(server_url: str, *, pool_size: int = POOL_SIZE) -> Iterator[PgBouncer]:
    """Start PgBouncer (``pool_mode = transaction``) in front of ``server_url``'s server, every
    database of it reachable by its name with the URL's user and password; stop it and remove
    its folder on exit."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        raise RuntimeError("pgbouncer is not installed (scripts/install.sh installs it)")
    server = make_url(server_url)
    user = server.username or "postgres"
    password = server.password or ""
    folder = Path(tempfile.mkdtemp(prefix="outboxkit-pgbouncer-"))
    port = _free_port()
    config = folder / "pgbouncer.ini"
    (folder / "userlist.txt").write_text(f'"{user}" "{password}"\n')
    config.write_text(
        "[databases]\n"
        f"* = host={server.host or '127.0.0.1'} port={server.port or 5432}"
        f" user={user} password={password}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = md5\n"
        f"auth_file = {folder / 'userlist.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        "min_pool_size = 0\n"
        "reserve_pool_size = 0\n"
        "server_round_robin = 1\n"
        "max_client_conn = 1000\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {folder / 'pgbouncer.log'}\n"
        "log_connections = 0\n"
        "log_disconnections = 0\n"
        "server_login_retry = 1\n"
    )
    command = [binary, str(config)]
    if os.geteuid() == 0:
        shutil.chown(folder, RUN_AS)
        for path in folder.iterdir():
            shutil.chown(path, RUN_AS)
        command[1:1] = ["-u", RUN_AS]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_listening(process, port)
        yield PgBouncer(port, server_url, folder)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(folder, ignore_errors=True)


def _wait_listening(process: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            error = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise RuntimeError(f"pgbouncer exited at start ({process.returncode}): {error}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"pgbouncer did not listen on port {port} within {START_TIMEOUT_S:g} s")
