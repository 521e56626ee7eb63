"""A server that stops answering the relay's connections (its backends frozen with SIGSTOP,
as a hung host would leave them) stalls the relay for its statement timeout, not for ever."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay, RelayOptions

from tests.relay.test_processes import check_order, published_count, write_sequence
from tests.support.kafka import read_topic, wait_for

OPTIONS = RelayOptions(
    lease_ttl_s=4.0, request_timeout_s=2.0, poll_interval_s=0.2, statement_timeout_s=2.0
)


@contextmanager
def frozen_backends(url: str) -> Iterator[list[int]]:
    """Freeze every server process now connected to ``url``'s database; thaw them after."""
    with psycopg.connect(url) as conn:
        pids = [
            row[0]
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
        ]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield pids
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


async def test_a_relay_goes_on_after_its_connections_stop_answering(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("freezing the server's processes needs root")
    relay = Relay(db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=OPTIONS)
    async with relay:
        write_sequence(pg_url, topic, 0, 20)
        await wait_for(lambda: published_count(pg_url), lambda n: n == 20, 60, "published")
        with frozen_backends(pg_url) as pids:
            assert pids, "the relay holds connections"
            write_sequence(pg_url, topic, 20, 20)  # on a new connection: not frozen
            await wait_for(lambda: published_count(pg_url), lambda n: n == 40, 30, "the rest")
    check_order(await read_topic(kafka_bootstrap, topic, expected=40), 40, allow_duplicates=True)
