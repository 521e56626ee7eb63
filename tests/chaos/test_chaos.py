"""The fault-injection run at CI size (``OUTBOXKIT_CHAOS_EVENTS``, default 20,000), in its three
variants; the logical ones with a CPU burner taking one core beside them, as on a busy machine,
and one replication slot drop (``OUTBOXKIT_CHAOS_SLOT_DROPS``, default 1). The sequence variant
(poll mode, half the events) keeps each key's order behind dead letters fixed and replayed.
The cluster variant runs small (3,000 events) on a three-node Kafka cluster; bigger runs by hand
(``python -m tests.chaos.run --cluster``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.chaos.run import Faults, Summary, run_chaos
from tests.support.waits import scaled

RUN_S = 1200
"""The bound of one run at CI size on a quiet machine (it takes 2-4 minutes there)."""


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(scaled(RUN_S))
def test_every_committed_event_applied_exactly_once_under_faults(tmp_path: Path) -> None:
    check_chaos(tmp_path, "poll")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(scaled(RUN_S))
def test_every_committed_event_applied_exactly_once_under_faults_in_logical_mode(
    tmp_path: Path,
) -> None:
    with cpu_burner(scaled(RUN_S)):
        check_chaos(tmp_path, "logical")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(scaled(RUN_S))
def test_every_committed_event_applied_exactly_once_under_faults_in_logical_mode_wal_messages(
    tmp_path: Path,
) -> None:
    with cpu_burner(scaled(RUN_S)):
        check_chaos(tmp_path, "logical", wal_messages=True)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(scaled(RUN_S))
def test_every_key_keeps_its_order_behind_dead_letters_replayed_under_faults(
    tmp_path: Path,
) -> None:
    summary = check_chaos(tmp_path, "poll", sequence=True, share=0.5)
    # Bad steps were dead-lettered, their keys blocked and released again by the replays.
    assert summary.letters_replayed >= 1 and summary.records_held_at_end == 0
    assert summary.event_keys_blocked >= 1 and summary.key_releases >= 1, asdict(summary)


@contextmanager
def cpu_burner(bound_s: float) -> Iterator[None]:
    """A process spinning on one core while the block runs (it ends by itself after
    ``bound_s`` seconds should this process die without killing it)."""
    spin = f"import time\nend = time.monotonic() + {bound_s}\nwhile time.monotonic() < end: pass"
    burner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


def check_chaos(
    tmp_path: Path, mode: str, wal_messages: bool = False, sequence: bool = False, share: float = 1
) -> Summary:
    """Run the chaos run with ``share`` of the CI size and check every promise it makes."""
    events = int(int(os.environ.get("OUTBOXKIT_CHAOS_EVENTS", "20000")) * share)
    seed = int(os.environ.get("OUTBOXKIT_CHAOS_SEED", "20261130"))
    slot_drops = int(os.environ.get("OUTBOXKIT_CHAOS_SLOT_DROPS", "1")) if mode == "logical" else 0
    faults = Faults(relay_kills=10, consumer_kills=10, slot_drops=slot_drops)
    summary = run_chaos(
        events,
        seed,
        faults,
        tmp_path,
        drain_timeout=600,
        mode=mode,
        wal_messages=wal_messages,
        sequence=sequence,
    )
    print(f"\nchaos summary ({summary.variant}):", asdict(summary))
    assert summary.problems == []
    assert summary.lost_events == 0 and summary.duplicate_effects == 0
    assert summary.keys_out_of_order == 0 and summary.outbox_rows_left == 0
    assert summary.committed_events >= events
    assert summary.effect_rows == summary.committed_events
    assert summary.relay_kills >= 10 and summary.consumer_kills >= 10
    assert summary.broker_restarts == 1 and summary.database_cuts == 1
    assert summary.slot_drops == slot_drops
    assert summary.rolled_back_events > 0
    assert summary.poison_records >= events // 1000
    assert summary.poison_dead_lettered == summary.poison_records
    assert summary.handler_hangs == 1
    return summary


CLUSTER_RUN_S = 300
"""The bound of the small cluster run on a quiet machine (it took 110 s beside other suites)."""


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(scaled(CLUSTER_RUN_S))
def test_every_committed_event_applied_exactly_once_while_cluster_leaders_change(
    tmp_path: Path,
) -> None:
    """The ``--cluster`` variant, small: 3,000 events on a three-node cluster, a partition
    leader killed and started again and one frozen, besides relay and consumer kills."""
    faults = Faults(
        relay_kills=2,
        consumer_kills=2,
        broker_restarts=0,
        database_cuts=0,
        leader_kills=1,
        leader_freezes=1,
    )
    seed = int(os.environ.get("OUTBOXKIT_CHAOS_SEED", "20261130"))
    summary = run_chaos(3000, seed, faults, tmp_path, drain_timeout=300, cluster=True)
    print(f"\nchaos summary ({summary.variant}):", asdict(summary))
    assert summary.problems == []
    assert summary.lost_events == 0 and summary.duplicate_effects == 0
    assert summary.keys_out_of_order == 0 and summary.outbox_rows_left == 0
    assert summary.effect_rows == summary.committed_events >= 3000
    assert summary.leader_kills == 1 and summary.leader_freezes == 1
    assert summary.poison_dead_lettered == summary.poison_records
