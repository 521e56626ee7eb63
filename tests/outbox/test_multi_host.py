"""Several hosts in a database URL, against a real primary and a real streaming standby.

Each of the three spellings users write (libpq's ``h1:p1,h2:p2``, SQLAlchemy's repeated
``host=``, ``host=h1,h2&port=p1,p2``) lists the standby first with
``target_session_attrs=read-write``: the engines (a poll relay publishing to Kafka), the LISTEN
connection and the logical relay's replication connection must all reach the primary. A host
that is down is passed over, and a host that never answers costs the connect timeout, not
asyncpg's 60 s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Iterator

import pytest
from outboxkit.migrations.runner import upgrade
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.notify import LISTEN_ERRORS, listening
from outboxkit.relay import Relay, RelayOptions
from outboxkit.relay.replication import SlotStream, StreamLost
from outboxkit.testing.postgres import _free_port
from outboxkit.testing.postgres_pair import FailoverPair, failover_pair
from sqlalchemy import text

from tests.relay.test_processes import check_order, published_count, write_sequence
from tests.support.kafka import read_topic, wait_for
from tests.support.waits import scaled

pytestmark = pytest.mark.integration
FORMS = ("libpq", "repeated", "lists")
OPTIONS = RelayOptions(lease_ttl_s=4.0, request_timeout_s=2.0, poll_interval_s=0.2, max_attempts=2)


def url_of(form: str, database: str, first: int, second: int, extra: str = "") -> str:
    """``database`` on 127.0.0.1 at ports ``first`` then ``second``, spelled as ``form``."""
    auth = "postgres:postgres@"
    attrs = "target_session_attrs=read-write" + extra
    if form == "libpq":
        return f"postgresql://{auth}127.0.0.1:{first},127.0.0.1:{second}/{database}?{attrs}"
    if form == "repeated":
        hosts = f"host=127.0.0.1:{first}&host=127.0.0.1:{second}"
        return f"postgresql://{auth}/{database}?{hosts}&{attrs}"
    return f"postgresql://{auth}/{database}?host=127.0.0.1,127.0.0.1&port={first},{second}&{attrs}"


@pytest.fixture(scope="module")
def pair() -> Iterator[FailoverPair]:
    if os.geteuid() != 0 or shutil.which("pg_createcluster") is None:
        pytest.skip("the primary and standby need root and pg_createcluster")
    with failover_pair() as made:
        yield made


@pytest.fixture
def database(pair: FailoverPair) -> str:
    """A migrated database of the test's own on the primary, replayed on the standby."""
    name = f"mh_{uuid.uuid4().hex[:10]}"
    pair.create_database(name)
    upgrade(pair.primary.url(name))
    pair.wait_replayed()
    return name


def relay(url: str, bootstrap: str, mode: str = "poll") -> Relay:
    options = RelayOptions(**{**OPTIONS.__dict__, "mode": mode})  # type: ignore[arg-type]
    return Relay(db_url=url, kafka=KafkaSettings(bootstrap=bootstrap), options=options)


def stream_lost(stream: SlotStream) -> bool:
    try:
        stream.take(10)
    except StreamLost:
        return True
    return False


@pytest.mark.parametrize("form", FORMS)
async def test_every_form_reaches_the_primary_past_the_standby(
    form: str, pair: FailoverPair, database: str, kafka_bootstrap: str, topic: str
) -> None:
    url = url_of(form, database, pair.standbys[0].port, pair.primary.port)
    # A sync engine (psycopg) writes: the standby would refuse the writes.
    write_sequence(url, topic, 0, 30, per_tx=10)
    assert await relay(url, kafka_bootstrap).drain(timeout_s=scaled(60)) == 30

    # The logical relay: the first drain makes the slot (on the primary: the standby has
    # none to give), the second streams over the replication connection.
    assert await relay(url, kafka_bootstrap, "logical").drain(timeout_s=scaled(60)) == 0
    write_sequence(url, topic, 30, 20, per_tx=5)
    assert await relay(url, kafka_bootstrap, "logical").drain(timeout_s=scaled(60)) == 20
    check_order(await read_topic(kafka_bootstrap, topic, expected=50), 50, allow_duplicates=False)

    # LISTEN: the standby would refuse it (no LISTEN during recovery).
    heard: list[str] = []
    async with listening(url, "multi_host", heard.append) as lost:
        engine = make_async_engine(url)
        async with engine.connect() as conn:
            await conn.execute(text("SELECT pg_notify('multi_host', 'hello')"))
            await conn.commit()
        await engine.dispose()
        await wait_for(lambda: heard, lambda got: got == ["hello"], 30, "the notification")
        assert not lost.is_set()


@pytest.mark.parametrize("form", FORMS)
async def test_a_first_host_that_is_down_is_passed_over(
    form: str, pair: FailoverPair, database: str, kafka_bootstrap: str, topic: str
) -> None:
    url = url_of(form, database, _free_port(), pair.primary.port)
    write_sequence(url, topic, 0, 10)
    assert await relay(url, kafka_bootstrap).drain(timeout_s=scaled(60)) == 10
    assert await relay(url, kafka_bootstrap, "logical").drain(timeout_s=scaled(60)) == 0
    write_sequence(url, topic, 10, 10)
    assert await relay(url, kafka_bootstrap, "logical").drain(timeout_s=scaled(60)) == 10
    heard: list[str] = []
    async with listening(url, "multi_host", heard.append):
        pair.primary.psql("NOTIFY multi_host, 'up'", database)
        await wait_for(lambda: heard, lambda got: got == ["up"], 30, "the notification")


async def connect_once(url: str) -> None:
    engine = make_async_engine(url)
    try:
        async with engine.connect():
            pass
    finally:
        await engine.dispose()


async def listen_once(url: str) -> None:
    async with listening(url, "multi_host", lambda _payload: None):
        pass


async def stream_once(url: str) -> None:
    stream = SlotStream(url, "no_slot", "no_publication", lambda: None, {})
    stream.start(asyncio.get_running_loop().call_soon_threadsafe)
    try:
        await wait_for(lambda: stream_lost(stream), bool, 15, "the stream to fail")
    finally:
        await stream.close()
    raise StreamLost("as expected")


async def seconds_to_fail(
    attempt: Awaitable[None], errors: type[BaseException] | tuple[type[BaseException], ...]
) -> float:
    started = time.monotonic()
    with pytest.raises(errors):
        await attempt
    return time.monotonic() - started


async def test_a_host_that_never_answers_costs_the_connect_timeout_per_host(
    pair: FailoverPair, database: str, mute_server: str
) -> None:
    hung = f"postgresql://postgres:postgres@{mute_server}/{database}"
    # The default bound: 10 s, where asyncpg alone waits 60 s.
    assert await seconds_to_fail(connect_once(hung), OSError) < scaled(15)
    # The URL's connect_timeout, for engines, LISTEN and the replication connection.
    bounded = f"{hung}?connect_timeout=2"
    assert await seconds_to_fail(connect_once(bounded), OSError) < scaled(5)
    assert await seconds_to_fail(listen_once(bounded), LISTEN_ERRORS) < scaled(5)
    assert await seconds_to_fail(stream_once(bounded), StreamLost) < scaled(5)

    # Hung first, primary second: each host gets its own timeout, so the primary is reached.
    port = int(mute_server.rsplit(":", 1)[1])
    engine = make_async_engine(
        url_of("libpq", database, port, pair.primary.port, "&connect_timeout=2")
    )
    async with engine.connect() as conn:
        assert await conn.scalar(text("SELECT pg_is_in_recovery()")) is False
    await engine.dispose()


async def test_after_a_failover_the_relay_and_its_listen_follow_to_the_new_primary(
    pair: FailoverPair,
    database: str,
    kafka_bootstrap: str,
    topic: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The module's last test: it stops the primary and promotes the standby."""
    caplog.set_level(logging.INFO)
    url = url_of("repeated", database, pair.primary.port, pair.standbys[0].port)
    async with relay(url, kafka_bootstrap):
        write_sequence(url, topic, 0, 10)
        await wait_for(lambda: published_count(url), lambda n: n == 10, 60, "published")
        standby = pair.standbys[0]
        pair.primary.stop()
        standby.promote()  # the URL lists both hosts: no front door to point
        await wait_for(
            lambda: standby.psql("SELECT pg_is_in_recovery()"), "f".__eq__, 60, "promoted"
        )
        write_sequence(url, topic, 10, 10)  # to the new primary, through the same URL
        await wait_for(lambda: published_count(url), lambda n: n == 20, 60, "published there")
        await wait_for(lambda: caplog.text, lambda t: "LISTEN restored" in t, 60, "LISTEN back")
    assert caplog.text.count("LISTEN connection lost") == 1
    check_order(await read_topic(kafka_bootstrap, topic, expected=20), 20, allow_duplicates=True)
