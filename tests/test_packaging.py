"""outboxkit installs one import package, and lives beside a service's own generic packages."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from outboxkit.outbox import new_event
from outboxkit.testing.kafka import create_topic
from outboxkit.testing.processes import terminate
from sqlalchemy import create_engine, text

from tests.support import REPO
from tests.support.consumers import produce_events
from tests.support.kafka import wait_for

EVENTS = 20


def test_a_wheel_installs_only_the_outboxkit_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("outboxkit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"outboxkit"}
    top_level = next(name for name in names if name.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["outboxkit"]
    shipped = ("relay/runner.py", "consumers/runtime.py", "migrations/versions/0001_outbox.py")
    for module in (*shipped, "outbox/dialects/postgresql.py", "outbox/dialects/sqlite.py"):
        assert f"outboxkit/{module}" in names
    assert "outboxkit/py.typed" in names


BILLING = '''
"""A service's own consumers package, named as services name it."""

from cloudevents.core.v1.event import CloudEvent
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

import outbox
import relay
from outboxkit import ConsumerApp

assert outbox.OWNER == relay.OWNER == "service", "the service's own packages must win"

app = ConsumerApp(name="billing")


@app.handler("shop.order.placed", topic="{topic}")
async def invoice(event: CloudEvent, session: AsyncSession) -> None:
    await session.execute(
        text("INSERT INTO invoices (order_id) VALUES (:id)"), {{"id": event.get_id()}}
    )
'''


def scratch_service(root: Path, topic: str) -> None:
    """A service with its own consumers, relay, outbox and (alembic init) migrations."""
    for package in ("consumers", "relay", "outbox"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text('OWNER = "service"\n')
    (root / "consumers" / "billing.py").write_text(textwrap.dedent(BILLING.format(topic=topic)))
    subprocess.run(
        [sys.executable, "-m", "alembic", "init", "migrations"],
        cwd=root,
        check=True,
        capture_output=True,
    )
    assert (root / "migrations" / "env.py").exists()


@pytest.mark.timeout(180)
async def test_a_service_with_its_own_consumers_package_runs_its_app(
    tmp_path: Path, pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    scratch_service(tmp_path, topic)
    engine = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE invoices (order_id text PRIMARY KEY)"))
    await create_topic(kafka_bootstrap, topic, partitions=2)
    events = [new_event("shop.order.placed", "/shop", {"n": n}) for n in range(EVENTS)]
    await produce_events(kafka_bootstrap, topic, events)

    outboxkit = Path(sys.executable).parent / "outboxkit"
    args = ["consume", "consumers.billing:app", "--db-url", pg_url, "--bootstrap", kafka_bootstrap]
    log = tmp_path / "consume.log"
    with log.open("wb") as out:
        process = subprocess.Popen([outboxkit, *args], cwd=tmp_path, stdout=out, stderr=out)

    def invoices() -> int:
        with engine.connect() as connection:
            return int(connection.execute(text("SELECT count(*) FROM invoices")).scalar_one())

    try:
        await wait_for(
            lambda: (invoices(), process.poll()),
            lambda seen: seen[0] == EVENTS or seen[1] is not None,
            120,
            f"{EVENTS} invoices",
        )
        assert invoices() == EVENTS, log.read_text()
    finally:
        code = terminate(process)
        engine.dispose()
    assert code == 0, log.read_text()
