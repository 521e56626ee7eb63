"""bench.growth at a tiny size, so the bench cannot rot: every path runs against real
PostgreSQL and Kafka, and what it reports is checked against the tables."""

from __future__ import annotations

import pytest

from bench import growth


def test_growth_bench_runs_every_path_at_a_tiny_size(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOXKIT_KAFKA_BOOTSTRAP", kafka_bootstrap)
    results = growth.main(
        [
            "--name", "growth-smoke", "--rounds", "1",
            "--inbox-sizes", "0,2000", "--batch", "50", "--batches", "2",
            "--relay-events", "300", "--relay-published", "2000", "--relay-parked", "200",
            "--ledger-ops", "500", "--idempotency-keys", "500", "--workflow-instances", "20",
            "--workflow-history", "5", "--calls", "3", "--purge-fraction", "0.5",
            "--inflow-rate", "200", "--inflow-seconds", "12", "--inflow-window", "3",
            "--inflow-sample", "4", "--inflow-retention-every", "1",
        ]
    )  # fmt: skip
    rows = {(row["path"], row["size"]): row for row in results["rows"]}
    # The inbox holds what was copied plus the claims of the measured chunks (3 warm-up + 2).
    assert rows["inbox", "2,000"]["rows"] >= 2000 + 5 * 50
    assert rows["inbox", "2,000"]["events_per_s"] > 0
    # Retention dropped the daily partitions that ended before the window (3.5 days of the
    # week's fill: from 2.5 to 3.5 days of it, by the time of day), leaving no dead tuple.
    assert 2000 * 2.5 / 7 - 10 <= results["inbox_retention"]["removed"] <= 1000
    assert rows["inbox", "2,000 after retention"]["dead_tuples"] == 0
    assert results["outbox_retention"]["removed"] >= 1000
    assert rows["relay", "2,000 published"]["rows"] >= 2000
    for kind in ("ledger", "idempotency"):
        assert results[f"{kind}_retention"]["removed"] >= 250
    assert any(path == "workflows" and size != "empty" for path, size in rows)
    inflow = results["inflow"]
    assert inflow["samples"], "no table sizes were sampled"
    last = inflow["samples"][-1]
    assert last["written"] > 0 and last["consumed"] > 0
    # The 3 s window slid: published rows older than it were purged. (The inbox's claims were
    # not: its partitions are a minute wide at least, so none ended a window ago in 12 s.)
    assert inflow["outbox_purged"] > 0
    assert inflow["purge_transactions"] > 0
