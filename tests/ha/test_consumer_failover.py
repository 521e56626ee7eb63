"""A consumer applying events through its inbox keeps going across a Patroni switchover.

Events go to Kafka all along; the consumer process (``outboxkit consume``, started once) writes
one effect row per application on the HA database through HAProxy. Every event must be applied
exactly once (count the effect rows), with no restart and each cause logged once, not in a loop.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cloudevents.core.v1.event import CloudEvent
from outboxkit.outbox import new_event
from outboxkit.testing.kafka import create_topic
from outboxkit.testing.patroni import PatroniCluster
from outboxkit.testing.processes import start_cli, terminate

from tests.consumers.test_crash import consume_args
from tests.ha.flow import Fault, outage, problem_lines, unless_switching
from tests.support.consumer_apps import WIDGET_TYPE
from tests.support.consumers import create_effects_table, effect_rows, produce_events
from tests.support.kafka import wait_for

PARTITIONS = 3
CHUNK = 10
MAX_REPEATS = 20


def effect_count(url: str) -> int:
    """How many effects were applied (0 while the primary moves)."""
    return unless_switching(lambda: len(effect_rows(url)), 0)


def keyed_widget(n: int) -> CloudEvent:
    """Widget ``n`` with a deterministic id, spread over the partitions by key."""
    return new_event(WIDGET_TYPE, "/widgets", {"n": n}, id=f"w-{n}", partitionkey=f"k{n % 7}")


class EffectSampler:
    """Counts the effect rows every quarter second; ``grew`` holds when the count went up."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.grew: list[float] = []
        self._last = 0

    async def run(self) -> None:
        while True:
            count = await asyncio.to_thread(effect_count, self.url)
            if count > self._last:
                self.grew.append(time.time())
                self._last = count
            await asyncio.sleep(0.25)


async def produce_steadily(
    bootstrap: str, topic: str, stop: asyncio.Event, sent: list[int]
) -> None:
    """Produce CHUNK widgets every tenth of a second until ``stop``; ``sent`` holds their ns."""
    while not stop.is_set():
        chunk = list(range(len(sent), len(sent) + CHUNK))
        await produce_events(bootstrap, topic, [keyed_widget(n) for n in chunk])
        sent.extend(chunk)
        await asyncio.sleep(0.1)


async def test_consumer_through_haproxy_applies_every_event_once_across_a_switchover(
    ha_cluster: PatroniCluster, ha_db: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    create_effects_table(ha_db)
    await create_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
    log = tmp_path / "consumer.log"
    consumer = start_cli(
        consume_args(ha_db, kafka_bootstrap, f"ha-{topic}"),
        log,
        env={"OUTBOXKIT_TEST_TOPIC": topic},
    )
    sent: list[int] = []
    stop = asyncio.Event()
    sampler = EffectSampler(ha_db)
    tasks = [
        asyncio.create_task(produce_steadily(kafka_bootstrap, topic, stop, sent)),
        asyncio.create_task(sampler.run()),
    ]
    try:
        await wait_for(lambda: effect_count(ha_db), lambda n: n >= 100, 60, "first effects")
        fault = Fault("switchover", time.time())
        await asyncio.to_thread(ha_cluster.switchover)
        fault.settled = time.time()
        after = len(sent)
        await wait_for(lambda: effect_count(ha_db), lambda n: n >= after, 90, "effects after it")
        stop.set()
        await tasks[0]
        await wait_for(lambda: effect_count(ha_db), lambda n: n >= len(sent), 90, "all")
        assert consumer.poll() is None, "the consumer exited"
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        code = await asyncio.to_thread(terminate, consumer)
    assert code == 0, log.read_text()[-3000:]
    rows = effect_rows(ha_db)
    applied = [row.event_id for row in rows]
    assert sorted(set(applied)) == sorted(keyed_widget(n).get_id() for n in sent)
    assert len(applied) == len(sent), f"{len(applied) - len(sent)} effects applied twice"
    causes = problem_lines(log)
    assert max(causes.values(), default=0) <= MAX_REPEATS, causes
    print(
        f"\nconsumer through HAProxy: {len(sent)} events, each applied once; "
        f"outage {outage(sampler.grew, fault):.2f} s; log causes {dict(causes)}"
    )
