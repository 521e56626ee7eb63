"""Prometheus metrics of the workflow engine.

Counters are bumped in the process that does the work (a transaction rolled back later still
counted it: the tables, not the metrics, are the truth). Gauges (instances per state, time in
state, open unknowns, approvals waiting, stuck work, compensations running) are read from the
database at scrape time by :class:`WorkflowCollector`, which a process registers once. Labels
hold workflow names, states, kinds, failure classes and outcomes only: never tenants, ids or keys.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from outboxkit.outbox.db import make_engine, parse_url
from outboxkit.outbox.dialects import dialect_of
from outboxkit.workflows.records import COMPENSATING, TERMINAL, Status
from outboxkit.workflows.tables import workflow_instances
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine, and_, func, or_, select
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("outboxkit.workflows")

TRANSITIONS = Counter(
    "outboxkit_workflow_transitions_total",
    "History records written, by workflow and kind (transition, wait, resume, failure, ...).",
    ["workflow", "kind"],
)
FAILURES = Counter(
    "outboxkit_workflow_failures_total",
    "Failed runs of a state, by workflow and failure class.",
    ["workflow", "failure_class"],
)
SIGNALS = Counter(
    "outboxkit_workflow_signals_total",
    "Signals taken, by outcome (accepted, pending, rejected, late, timer, duplicate).",
    ["outcome"],
)

DEFAULT_STUCK_AFTER_S = 300.0
# Waits are stored as sorted, compact JSON: an approval wait holds "request_hash":"<hex>",
# any other wait "request_hash":null. A LIKE finds them without reading every wait.
_APPROVAL_WAIT = '%"request_hash":"%'


@dataclass
class _Families:
    """The gauges of one scrape, filled from the database."""

    instances: GaugeMetricFamily
    oldest_in_state: GaugeMetricFamily
    unknowns: GaugeMetricFamily
    oldest_unknown: GaugeMetricFamily
    approvals: GaugeMetricFamily
    oldest_approval: GaugeMetricFamily
    stuck: GaugeMetricFamily
    oldest_due: GaugeMetricFamily
    compensating: GaugeMetricFamily
    compensations_left: GaugeMetricFamily

    def all(self) -> list[GaugeMetricFamily]:
        return [
            self.instances,
            self.oldest_in_state,
            self.unknowns,
            self.oldest_unknown,
            self.approvals,
            self.oldest_approval,
            self.stuck,
            self.oldest_due,
            self.compensating,
            self.compensations_left,
        ]


def _families() -> _Families:
    wf = ["workflow"]
    return _Families(
        GaugeMetricFamily(
            "outboxkit_workflow_instances",
            "Instances per workflow and state.",
            labels=[*wf, "state"],
        ),
        GaugeMetricFamily(
            "outboxkit_workflow_oldest_in_state_seconds",
            "Longest time an instance has been in a state (states that are not terminal).",
            labels=[*wf, "state"],
        ),
        GaugeMetricFamily(
            "outboxkit_workflow_open_unknowns",
            "Instances with an operation of unknown outcome open.",
            labels=wf,
        ),
        GaugeMetricFamily(
            "outboxkit_workflow_oldest_unknown_seconds",
            "Age of the oldest open unknown (since the instance first failed on it or entered "
            "human_review with it).",
            labels=wf,
        ),
        GaugeMetricFamily(
            "outboxkit_workflow_approvals_waiting",
            "Instances waiting for an approval bound to a request hash.",
            labels=wf,
        ),
        GaugeMetricFamily(
            "outboxkit_workflow_oldest_approval_wait_seconds",
            "How long the oldest approval has been awaited.",
            labels=wf,
        ),
        GaugeMetricFamily(
            "outboxkit_workflow_stuck",
            "Work not taken forward: 'overdue' (due longer than the threshold) or "
            "'lease_expired' (its worker's lease ran out).",
            labels=[*wf, "reason"],
        ),
        GaugeMetricFamily(
            "outboxkit_workflow_oldest_due_seconds",
            "How long the oldest due step (run_at or a passed wait deadline) has waited for a "
            "worker.",
            labels=wf,
        ),
        GaugeMetricFamily(
            "outboxkit_workflow_compensating",
            "Instances running their compensations.",
            labels=wf,
        ),
        GaugeMetricFamily(
            "outboxkit_workflow_compensations_left",
            "Compensations still to run in instances that are compensating.",
            labels=wf,
        ),
    )


class WorkflowCollector(Collector):
    """The workflow gauges, read from the database at scrape time.

    Register it once per process:
    ``prometheus_client.REGISTRY.register(WorkflowCollector(engine))`` with a sync
    SQLAlchemy engine (:meth:`for_url` makes one with short timeouts). ``clock`` is the
    business clock of the workflow engine (ages are measured on it); ``stuck_after_s`` is how
    long due work may wait for a worker before it counts as stuck.

    A failed read never fails the scrape, and never touches the workers: the scrape answers
    ``outboxkit_workflow_collector_up 0`` without the gauges, and the failure is logged.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Callable[[], float] = time.time,
        stuck_after_s: float = DEFAULT_STUCK_AFTER_S,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.stuck_after_s = stuck_after_s
        self.failures = 0

    @classmethod
    def for_url(
        cls,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        stuck_after_s: float = DEFAULT_STUCK_AFTER_S,
        timeout_s: float = 5.0,
    ) -> WorkflowCollector:
        """A collector with its own small pool on ``url``; a read is bounded by ``timeout_s``."""
        args = dialect_of(parse_url(url)).bounded_sync_args(timeout_s)
        engine = make_engine(
            url, pool_size=1, max_overflow=1, pool_pre_ping=True, connect_args=args
        )
        return cls(engine, clock=clock, stuck_after_s=stuck_after_s)

    def describe(self) -> list[GaugeMetricFamily]:
        """The families, without reading the database (registration must not touch it)."""
        return [*_families().all(), _up(1)]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Read the gauges; on a database failure yield only ``collector_up`` 0."""
        try:
            with self.engine.connect() as conn:
                families = self._read(conn)
        except (SQLAlchemyError, OSError) as error:
            self.failures += 1
            log.warning(
                "workflow metrics: database read failed (%s); gauges left out of this scrape",
                type(error).__name__,
            )
            yield _up(0)
            return
        yield from families.all()
        yield _up(1)

    def _read(self, conn: Connection) -> _Families:
        table = workflow_instances
        families = _families()
        now = int(self.clock() * 1000)
        db_now = dialect_of(conn).now_ms()
        rows = conn.execute(
            select(
                table.c.name, table.c.state, func.count(), func.min(table.c.state_since_ms)
            ).group_by(table.c.name, table.c.state)
        ).all()
        for name, state, count, since in rows:
            families.instances.add_metric([name, state], count)
            if state not in TERMINAL:
                families.oldest_in_state.add_metric([name, state], _age(now, since))
        live = table.c.status != Status.DONE.value
        unknown_since = func.coalesce(table.c.first_failure_ms, table.c.state_since_ms)
        for name, count, since in conn.execute(
            select(table.c.name, func.count(), func.min(unknown_since))
            .where(live, table.c.open_unknown.is_not(None))
            .group_by(table.c.name)
        ):
            families.unknowns.add_metric([name], count)
            families.oldest_unknown.add_metric([name], _age(now, since))
        for name, count, since in conn.execute(
            select(table.c.name, func.count(), func.min(table.c.state_since_ms))
            .where(table.c.status == Status.WAITING.value, table.c.wait.like(_APPROVAL_WAIT))
            .group_by(table.c.name)
        ):
            families.approvals.add_metric([name], count)
            families.oldest_approval.add_metric([name], _age(now, since))
        due_at = func.coalesce(table.c.run_at_ms, table.c.wait_deadline_ms)
        due = or_(
            and_(table.c.status == Status.RUNNABLE.value, table.c.run_at_ms <= now),
            and_(table.c.status == Status.WAITING.value, table.c.wait_deadline_ms <= now),
        )
        threshold = now - int(self.stuck_after_s * 1000)
        overdue = or_(
            and_(table.c.status == Status.RUNNABLE.value, table.c.run_at_ms <= threshold),
            and_(table.c.status == Status.WAITING.value, table.c.wait_deadline_ms <= threshold),
        )
        for name, oldest in conn.execute(
            select(table.c.name, func.min(due_at)).where(due).group_by(table.c.name)
        ):
            families.oldest_due.add_metric([name], _age(now, oldest))
        for name, count in conn.execute(
            select(table.c.name, func.count()).where(overdue).group_by(table.c.name)
        ):
            families.stuck.add_metric([name, "overdue"], count)
        for name, count in conn.execute(
            select(table.c.name, func.count())
            .where(live, table.c.lease_holder.is_not(None), table.c.lease_expires_ms < db_now)
            .group_by(table.c.name)
        ):
            families.stuck.add_metric([name, "lease_expired"], count)
        left: dict[str, tuple[int, int]] = {}
        for name, compensations in conn.execute(
            select(table.c.name, table.c.compensations).where(table.c.state == COMPENSATING)
        ):
            instances, entries = left.get(name, (0, 0))
            left[name] = (instances + 1, entries + len(json.loads(compensations)))
        for name, (instances, entries) in left.items():
            families.compensating.add_metric([name], instances)
            families.compensations_left.add_metric([name], entries)
        return families


def _age(now_ms: int, since_ms: int | None) -> float:
    return 0.0 if since_ms is None else max(0, now_ms - since_ms) / 1000


def _up(value: int) -> GaugeMetricFamily:
    up = GaugeMetricFamily(
        "outboxkit_workflow_collector_up",
        "1 when the last scrape read the workflow tables, 0 when the read failed.",
    )
    up.add_metric([], value)
    return up
