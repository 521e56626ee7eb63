"""The built distributions as a user gets them: the sdist carries LICENSE, CHANGELOG and the
docs; the wheel built from it installs into a fresh virtualenv outside the repository with no
PostgreSQL driver, and its ``outboxkit`` runs ``migrate``, ``relay --drain``, ``consume`` and
``status`` on SQLite against a real broker."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import uv
from outboxkit.testing.processes import terminate
from sqlalchemy import create_engine, text

from tests.support import REPO
from tests.support.kafka import wait_for

EVENTS = 12
# Building the sdist and the wheel and installing it take minutes on a loaded machine.
pytestmark = pytest.mark.timeout(1200)
DRIVERS = ("asyncpg", "psycopg", "psycopg2")


@dataclass(frozen=True)
class Installed:
    """A fresh virtualenv holding the wheel (no extras), and the built distributions."""

    venv: Path
    sdist: Path
    wheel: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def outboxkit(self) -> Path:
        return self.venv / "bin" / "outboxkit"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("install")
    dist = root / "dist"
    # The sdist first, then the wheel built from it: what a user's pip does with the sdist.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--installer",
            "uv",
            "--outdir",
            str(dist),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (sdist,) = dist.glob("outboxkit-*.tar.gz")
    (wheel,) = dist.glob("outboxkit-*.whl")
    venv = root / "venv"
    uv_bin = uv.find_uv_bin()
    subprocess.run([uv_bin, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    subprocess.run(
        [uv_bin, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return Installed(venv, sdist, wheel)


def test_the_sdist_carries_licence_changelog_and_docs(installed: Installed) -> None:
    with tarfile.open(installed.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "docs/deploy.md", "docs/relay.md"} <= names
    assert "migrations/versions/0001_outbox.py" in names


def test_the_wheel_declares_its_metadata(installed: Installed) -> None:
    metadata = subprocess.run(
        [
            str(installed.python),
            "-c",
            "from importlib.metadata import distribution; import sys; "
            "sys.stdout.write(distribution('outboxkit').read_text('METADATA'))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=installed.venv,  # not the repository, whose outboxkit.egg-info would be found
    ).stdout
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
    for version in ("3.11", "3.12", "3.13"):
        assert f"Classifier: Programming Language :: Python :: {version}" in metadata
    assert "Project-URL: Changelog, " in metadata
    assert "Provides-Extra: postgres" in metadata and "Provides-Extra: logical" in metadata
    version = run(installed, "-c", "import outboxkit; print(outboxkit.__version__)").stdout
    assert version.strip() == "0.2.0"
    assert "\nVersion: 0.2.0\n" in metadata


def run(
    installed: Installed, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(installed.python), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd or installed.venv,  # the repository's own folders must not be importable
        timeout=300,
    )


def test_a_sqlite_install_has_no_postgresql_driver(installed: Installed) -> None:
    for driver in DRIVERS:
        found = run(installed, "-c", f"import {driver}")
        assert found.returncode != 0 and "ModuleNotFoundError" in found.stderr, driver
    size = subprocess.run(
        ["du", "-sh", str(next(installed.venv.glob("lib/python3.*/site-packages")))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    print(f"site-packages of a SQLite-only install: {size}")


def test_postgresql_without_its_extra_is_one_line_naming_it(
    installed: Installed, tmp_path: Path
) -> None:
    result = subprocess.run(
        [str(installed.outboxkit), "migrate", "--db-url", "postgresql://u:p@127.0.0.1:1/db"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    # migrate reaches the database through asyncpg first (its wording of a failure), then psycopg
    assert line.endswith(
        "PostgreSQL needs asyncpg, which is not installed: pip install 'outboxkit[postgres]'"
    )


PRODUCE = """
import sys
from sqlalchemy.orm import Session
from outboxkit import Outbox, new_event
from outboxkit.outbox.db import make_engine

url, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
outbox = Outbox(topics={"shop.order.placed": topic})
engine = make_engine(url)
with Session(engine) as session, session.begin():
    for n in range(count):
        event = new_event("shop.order.placed", "/shop", {"n": n}, partitionkey=str(n % 3))
        outbox.add(session, event)
engine.dispose()
"""

BILLING = """
from cloudevents.core.v1.event import CloudEvent
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from outboxkit import ConsumerApp

app = ConsumerApp(name="billing")


@app.handler("shop.order.placed", topic="{topic}")
async def invoice(event: CloudEvent, session: AsyncSession) -> None:
    await session.execute(
        text("INSERT INTO invoices (event_id) VALUES (:id)"), {{"id": event.get_id()}}
    )
"""


async def test_the_installed_cli_runs_the_pipeline_on_sqlite(
    installed: Installed, tmp_path: Path, kafka_bootstrap: str, topic: str
) -> None:
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    common = ["--db-url", url, "--bootstrap", kafka_bootstrap]
    cli = [str(installed.outboxkit)]

    def outboxkit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], capture_output=True, text=True, check=False, cwd=tmp_path, timeout=300
        )

    migrated = outboxkit("migrate", "--db-url", url)
    assert migrated.returncode == 0, migrated.stderr
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE invoices (event_id text PRIMARY KEY)"))
    (tmp_path / "produce.py").write_text(PRODUCE)
    produced = run(installed, "produce.py", url, topic, str(EVENTS), cwd=tmp_path)
    assert produced.returncode == 0, produced.stderr

    drained = outboxkit("relay", "--drain", *common)
    assert drained.returncode == 0, drained.stderr

    (tmp_path / "billing.py").write_text(textwrap.dedent(BILLING.format(topic=topic)))
    log = tmp_path / "consume.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*cli, "consume", "billing:app", *common], cwd=tmp_path, stdout=out, stderr=out
        )

    def invoices() -> int:
        with engine.connect() as connection:
            return int(connection.execute(text("SELECT count(*) FROM invoices")).scalar_one())

    try:
        await wait_for(
            lambda: (invoices(), process.poll()),
            lambda seen: seen[0] == EVENTS or seen[1] is not None,
            240,
            f"{EVENTS} invoices",
        )
        assert invoices() == EVENTS, log.read_text()
    finally:
        code = terminate(process)
        engine.dispose()
    assert code == 0, log.read_text()

    status = outboxkit("status", *common)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "backlog 0" in status.stdout
    assert REPO not in installed.venv.parents  # installed outside the repository
