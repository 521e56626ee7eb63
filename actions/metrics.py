"""Prometheus metrics of agent actions.

Transition counters are bumped when a transition is written (a transaction rolled back later
still counted it: the tables, not the metrics, are the truth). Operations by state come from the
database at scrape time through :class:`OperationStateCollector`, which a process registers
once. Labels hold states, outcomes and action types only, never keys, tenants or parameters.
"""

from __future__ import annotations

from collections.abc import Iterator

from outboxkit.actions.tables import agent_operations
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine, func, select

TRANSITIONS = Counter(
    "outboxkit_action_transitions", "State transitions written.", ["from_state", "to_state"]
)
STATE_SECONDS = Histogram(
    "outboxkit_action_state_seconds",
    "Seconds an operation spent in RUNNING or UNKNOWN before leaving it.",
    ["state"],
    buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
)
CONFLICTS = Counter(
    "outboxkit_action_conflicts", "Begins refused: the same key came with other parameters."
)
RECONCILIATIONS = Counter(
    "outboxkit_action_reconciliations", "Reconciler answers applied.", ["outcome"]
)
RESOLUTIONS = Counter(
    "outboxkit_action_operator_resolutions", "Operations resolved by hand.", ["resolution"]
)


class OperationStateCollector(Collector):
    """``outboxkit_action_operations{state}``: operations per state, read at scrape time.

    Register it with ``prometheus_client.REGISTRY.register(OperationStateCollector(engine))``.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One gauge sample per state, plus the count flagged for a person."""
        family = GaugeMetricFamily(
            "outboxkit_action_operations", "Operations per state.", labels=["state"]
        )
        flagged = GaugeMetricFamily(
            "outboxkit_action_needs_attention", "UNKNOWN operations flagged for a person."
        )
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(agent_operations.c.state, func.count()).group_by(agent_operations.c.state)
            ).all()
            attention = conn.scalar(
                select(func.count())
                .select_from(agent_operations)
                .where(agent_operations.c.needs_attention.is_(True))
            )
        for state, count in rows:
            family.add_metric([state], count)
        flagged.add_metric([], attention or 0)
        yield family
        yield flagged
