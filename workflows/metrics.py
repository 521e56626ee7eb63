"""Prometheus metrics of the workflow engine (counters; gauges come from the database)."""

from __future__ import annotations

from prometheus_client import Counter

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
