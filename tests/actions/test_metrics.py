"""Agent-action metrics: transitions, conflicts, reconciliations and resolutions, by state."""

from __future__ import annotations

import pytest
from outboxkit.actions import ActionStore, Found, OperationConflictError, Resolution
from outboxkit.actions.metrics import OperationStateCollector
from outboxkit.outbox.db import make_engine
from prometheus_client import REGISTRY, CollectorRegistry

from tests.support.actions import begin, in_tx, sessions_for

T = "acme"


def req(key: str, amount: int = 500) -> dict:
    return {
        "tenant": T,
        "key": key,
        "action_type": "payments.refund",
        "params": {"charge_id": "ch_1", "amount_cents": amount},
    }


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_counters_follow_the_operations(db_url: str) -> None:
    before = {
        "started": sample(
            "outboxkit_action_transitions_total", from_state="PENDING", to_state="RUNNING"
        ),
        "conflicts": sample("outboxkit_action_conflicts_total"),
        "found": sample("outboxkit_action_reconciliations_total", outcome="found"),
        "manual": sample("outboxkit_action_operator_resolutions_total", resolution="failed"),
        "unknown_time": sample("outboxkit_action_state_seconds_count", state="UNKNOWN"),
    }
    store = ActionStore()
    async with sessions_for(db_url) as sessions:
        done = await begin(sessions, store, **req("op-ok"))
        await in_tx(sessions, lambda s: store.complete(s, done.lease, result={"ok": 1}))
        with pytest.raises(OperationConflictError):
            await begin(sessions, store, **req("op-ok", amount=501))
        lost = await begin(sessions, store, **req("op-lost"))
        unknown = await in_tx(sessions, lambda s: store.mark_unknown(s, lost.lease, "timeout"))
        await in_tx(sessions, lambda s: store.reconcile(s, unknown, Found(result={"ok": 2})))
        stuck = await begin(sessions, store, **req("op-stuck"))
        await in_tx(sessions, lambda s: store.mark_unknown(s, stuck.lease, "timeout"))
        await in_tx(
            sessions,
            lambda s: store.resolve(
                s,
                tenant=T,
                key="op-stuck",
                resolution=Resolution.FAILED,
                by="ops",
                reason="refused",
            ),
        )

    started = sample("outboxkit_action_transitions_total", from_state="PENDING", to_state="RUNNING")
    assert started - before["started"] == 3
    assert sample("outboxkit_action_conflicts_total") - before["conflicts"] == 1
    found = sample("outboxkit_action_reconciliations_total", outcome="found")
    assert found - before["found"] == 1
    manual = sample("outboxkit_action_operator_resolutions_total", resolution="failed")
    assert manual - before["manual"] == 1
    unknown_time = sample("outboxkit_action_state_seconds_count", state="UNKNOWN")
    assert unknown_time - before["unknown_time"] == 2

    registry = CollectorRegistry()
    engine = make_engine(db_url)
    registry.register(OperationStateCollector(engine))
    assert registry.get_sample_value("outboxkit_action_operations", {"state": "SUCCEEDED"}) == 2
    assert registry.get_sample_value("outboxkit_action_operations", {"state": "FAILED_FINAL"}) == 1
    assert registry.get_sample_value("outboxkit_action_needs_attention") == 0
    engine.dispose()
