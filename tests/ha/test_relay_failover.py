"""The poll relay follows a Patroni switchover and a failover by itself, through HAProxy.

Events are committed before, during and after each fault by a steady writer (an application
retrying its failed transactions); the relay process started once must publish every row the
database holds to a real Kafka broker, leave none unpublished, and log each cause once, not in
a loop.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

from outboxkit.testing.patroni import PatroniCluster
from outboxkit.testing.processes import start_cli, terminate

from tests.ha.flow import (
    Fault,
    SteadyWriter,
    check_delivery,
    outages,
    outbox_rows,
    problem_lines,
    published_times,
    unless_switching,
)
from tests.relay.test_processes import relay_args
from tests.support.kafka import read_topic, wait_for

MAX_REPEATS = 20  # a cause logged more often than this over two faults is a loop


def published(url: str, relay: subprocess.Popen[bytes], log: Path) -> int:
    """How many rows are published (0 while the primary moves); fails at once if the relay
    exited."""
    assert relay.poll() is None, f"the relay exited: {log.read_text()[-2000:]}"
    return unless_switching(lambda: len(published_times(url)), 0)


async def run_through_faults(
    cluster: PatroniCluster, relay_url: str, check_url: str, bootstrap: str, topic: str, log: Path
) -> dict[str, object]:
    """Start one relay on ``relay_url``, write all along, switch over then fail over; return
    the figures. Asserts that nothing is lost and the relay never restarted."""
    relay = start_cli(relay_args(relay_url, bootstrap), log)
    writer = SteadyWriter(check_url, topic)
    faults: list[Fault] = []
    try:
        writer.start()
        await wait_for(lambda: published(check_url, relay, log), lambda n: n >= 50, 60, "first 50")
        for kind in ("switchover", "failover"):
            fault = Fault(kind, time.time())
            await asyncio.to_thread(getattr(cluster, kind))
            fault.settled = time.time()
            faults.append(fault)
            done = len(writer.acknowledged)
            await wait_for(
                lambda: published(check_url, relay, log),
                lambda n, want=done + 50: n >= want,
                90,
                f"publishing after the {kind}",
            )
            assert relay.poll() is None, f"the relay exited during the {kind}"
        writer.stop()
        seqs, _ = outbox_rows(check_url)
        await wait_for(
            lambda: unless_switching(lambda: outbox_rows(check_url)[1], -1),
            lambda n: n == 0,
            90,
            "all published",
        )
    finally:
        code = terminate(relay)
        writer.stop()
    assert code == 0, log.read_text()[-3000:]
    assert set(writer.acknowledged) <= set(seqs), "a commit the writer saw is gone"
    delivery = check_delivery(await read_topic(bootstrap, topic, expected=len(seqs)), seqs)
    assert delivery.missing == [], f"{len(delivery.missing)} rows never reached Kafka"
    assert delivery.distinct == len(seqs)
    assert delivery.order_broken == []
    causes = problem_lines(log)
    assert max(causes.values(), default=0) <= MAX_REPEATS, causes
    text = log.read_text()
    assert text.count("LISTEN connection lost") == text.count("LISTEN restored")
    times = published_times(check_url)
    return {
        "events": len(seqs),
        "duplicates": delivery.duplicates,
        "writer_errors": len(writer.errors),
        "write_outage_s": outages(writer.commits, faults),
        "relay_outage_s": outages(times, faults),
        "relay_log_causes": dict(causes),
    }


async def test_poll_relay_through_haproxy_follows_a_switchover_and_a_failover(
    ha_cluster: PatroniCluster, ha_db: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    figures = await run_through_faults(
        ha_cluster, ha_db, ha_db, kafka_bootstrap, topic, tmp_path / "relay.log"
    )
    print(f"\nrelay through HAProxy: {figures}")


async def test_poll_relay_through_a_multihost_url_follows_a_switchover_and_a_failover(
    ha_cluster: PatroniCluster, ha_db: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    from sqlalchemy.engine import make_url

    database = make_url(ha_db).database
    assert database is not None
    figures = await run_through_faults(
        ha_cluster,
        ha_cluster.multihost_url(database),
        ha_db,
        kafka_bootstrap,
        topic,
        tmp_path / "relay.log",
    )
    print(f"\nrelay through a multi-host URL: {figures}")
