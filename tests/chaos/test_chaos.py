"""The fault-injection run at CI size (``OUTBOXKIT_CHAOS_EVENTS``, default 20,000)."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.chaos.run import run_chaos


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_every_committed_event_applied_exactly_once_under_faults(tmp_path: Path) -> None:
    check_chaos(tmp_path, "poll")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_every_committed_event_applied_exactly_once_under_faults_in_logical_mode(
    tmp_path: Path,
) -> None:
    check_chaos(tmp_path, "logical")


def check_chaos(tmp_path: Path, mode: str) -> None:
    events = int(os.environ.get("OUTBOXKIT_CHAOS_EVENTS", "20000"))
    seed = int(os.environ.get("OUTBOXKIT_CHAOS_SEED", "20261130"))
    summary = run_chaos(events, seed, kills_each=10, workdir=tmp_path, drain_timeout=600, mode=mode)
    print(f"\nchaos summary ({mode} mode):", asdict(summary))
    assert summary.problems == []
    assert summary.committed_events >= events
    assert summary.effect_rows == summary.committed_events
    assert summary.relay_kills >= 10 and summary.consumer_kills >= 10
    assert summary.broker_restarts == 1 and summary.database_cuts == 1
    assert summary.rolled_back_events > 0
    assert summary.poison_records >= events // 1000
    assert summary.poison_dead_lettered == summary.poison_records
    assert summary.handler_hangs == 1
