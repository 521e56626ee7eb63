"""By hand: N Patroni switchovers and N failovers under a steady flow, and what was lost.

A writer commits outbox events all along through HAProxy (an application retrying its failed
transactions), one poll relay publishes them to Kafka and one consumer applies them through its
inbox, each process started once and never restarted, all three on the HA database through
HAProxy. Switchovers and failovers (kill -9 of the primary's postmaster) alternate with a pause
between them. At the end it prints the figures: events committed, lost (a committed row with no
effect, or a commit the writer saw that is gone), effects applied twice, keys whose effects
came out of order, the outage each fault caused, and the processes' WARNING/ERROR causes.

    python -m tests.chaos.failover --faults 3 --pause 5

Needs root and Debian's patroni, etcd-server, haproxy (scripts/install.sh); Kafka is
``OUTBOXKIT_KAFKA_BOOTSTRAP`` or a broker started here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from cloudevents.core.v1.event import CloudEvent
from outboxkit.migrations.runner import upgrade
from outboxkit.outbox import new_event
from outboxkit.testing.kafka import broker_from_env, create_topic
from outboxkit.testing.patroni import patroni_cluster
from outboxkit.testing.processes import start_cli, terminate

from tests.consumers.test_crash import consume_args
from tests.ha.flow import Fault, SteadyWriter, outages, outbox_rows, problem_lines, unless_switching
from tests.relay.test_processes import relay_args
from tests.support.consumer_apps import WIDGET_TYPE
from tests.support.consumers import create_effects_table, effect_rows

KEYS = 40
PARTITIONS = 3


def keyed_widget(seq: int) -> CloudEvent:
    """Widget ``seq``: its id names it, its key is one of :data:`KEYS`."""
    return new_event(WIDGET_TYPE, "/ha", {"n": seq}, id=f"w-{seq}", partitionkey=f"k{seq % KEYS}")


async def wait(
    probe: Callable[[], int], done: Callable[[int], bool], timeout_s: float, what: str
) -> None:
    """Wait until ``done(probe())``; a probe failing while the primary moves counts as -1."""
    deadline = time.monotonic() + timeout_s
    while not done(unless_switching(probe, -1)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout_s:g} s")
        await asyncio.sleep(0.5)


async def run(faults: int, pause_s: float, workdir: Path) -> dict[str, object]:
    with patroni_cluster() as cluster, broker_from_env() as bootstrap:
        url = cluster.create_database("chaos")
        upgrade(url)
        create_effects_table(url)
        topic = f"ha-chaos-{int(time.time())}"
        await create_topic(bootstrap, topic, partitions=PARTITIONS)
        env = {"OUTBOXKIT_TEST_TOPIC": topic}
        relay = start_cli(relay_args(url, bootstrap), workdir / "relay.log")
        consumer = start_cli(consume_args(url, bootstrap, topic), workdir / "consumer.log", env=env)
        writer = SteadyWriter(url, topic, make_event=keyed_widget)
        done: list[Fault] = []
        began = time.monotonic()
        try:
            writer.start()
            await asyncio.sleep(pause_s)
            for index in range(2 * faults):
                fault = Fault("switchover" if index % 2 == 0 else "failover", time.time())
                await asyncio.to_thread(getattr(cluster, fault.kind))
                fault.settled = time.time()
                done.append(fault)
                print(f"{fault.kind} {index // 2 + 1}: {fault.settled - fault.began:.1f} s")
                await asyncio.sleep(pause_s)
            writer.stop()
            drain = time.monotonic()
            await wait(lambda: outbox_rows(url, "n")[1], lambda n: n == 0, 600, "empty backlog")
            committed = len(outbox_rows(url, "n")[0])
            try:
                await wait(lambda: len(effect_rows(url)), lambda n: n >= committed, 120, "effects")
            except TimeoutError:
                print("not every committed event was applied within 120 s: see the figures")
            drained_s = time.monotonic() - drain
            alive = {"relay": relay.poll() is None, "consumer": consumer.poll() is None}
        finally:
            writer.stop()
            codes = {"relay": terminate(relay), "consumer": terminate(consumer)}
        seqs, unpublished = outbox_rows(url, "n")
        rows = effect_rows(url)
    applied: dict[int, int] = defaultdict(int)
    firsts: dict[int, list[int]] = defaultdict(list)
    for row in rows:  # in the order they were applied
        if applied[row.n] == 0:
            firsts[row.n % KEYS].append(row.n)
        applied[row.n] += 1
    return {
        "committed_events": len(seqs),
        "acknowledged_commits_gone": len(set(writer.acknowledged) - set(seqs)),
        "lost": len(set(seqs) - set(applied)),
        "applied_twice": sum(1 for count in applied.values() if count > 1),
        "keys_out_of_order": sum(1 for got in firsts.values() if got != sorted(got)),
        "unpublished_left": unpublished,
        "switchovers": faults,
        "failovers": faults,
        "write_outage_s": outages(writer.commits, done),
        "fault_seconds": [round(f.settled - f.began, 2) for f in done],
        "writer_errors": [
            f"+{b - nearest(done, b):.1f}s took {d:.1f}s: {m}" for b, d, m in writer.errors
        ],
        "writer_slow_commits": [
            f"+{b - nearest(done, b):.1f}s took {d:.1f}s" for b, d in writer.slow
        ],
        "processes_alive_at_end": alive,
        "exit_codes": codes,
        "drain_after_last_fault_s": round(drained_s, 1),
        "seconds_total": round(time.monotonic() - began, 1),
        "relay_log_causes": dict(problem_lines(workdir / "relay.log")),
        "consumer_log_causes": dict(problem_lines(workdir / "consumer.log")),
    }


def nearest(faults: list[Fault], at: float) -> float:
    """When the last fault before ``at`` began."""
    return max((f.began for f in faults if f.began <= at), default=at)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=3, help="switchovers, and as many failovers")
    parser.add_argument("--pause", type=float, default=5.0, help="seconds between faults")
    parser.add_argument("--workdir", type=Path, help="for the logs (default: a new temp dir)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="outboxkit-ha-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    summary = asyncio.run(run(args.faults, args.pause, workdir))
    print(json.dumps(summary, indent=2))
    print(f"logs: {workdir}")
    bad = summary["lost"] or summary["applied_twice"] or summary["keys_out_of_order"]
    raise SystemExit(1 if bad or summary["acknowledged_commits_gone"] else 0)


if __name__ == "__main__":
    main()
