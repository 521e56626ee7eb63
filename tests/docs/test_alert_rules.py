"""The shipped Prometheus rules (docs/prometheus-rules.yml) are the alert table of
docs/observability.md, and name only metrics the code exports."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "prometheus-rules.yml"
OBSERVABILITY = ROOT / "docs" / "observability.md"
# The packages that export metrics (the folders of outboxkit's subpackages).
SOURCES = ("outbox", "relay", "consumers", "actions", "workflows")
METRIC = re.compile(r"\boutboxkit_[a-z0-9_]+")
# What prometheus_client adds to a counter's or a histogram's name.
SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def exported() -> set[str]:
    """Every metric name the code declares (a quoted ``outboxkit_...`` string in a module
    that builds metrics), as Prometheus sees it: counters and histograms with their suffixes."""
    names: set[str] = set()
    for package in SOURCES:
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if "prometheus_client" not in text:
                continue
            names.update(re.findall(r"[\"'](outboxkit_[a-z0-9_]+)[\"']", text))
    return names | {name + suffix for name in names for suffix in SUFFIXES}


def rules() -> list[dict[str, str]]:
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def table_expressions() -> list[str]:
    """The PromQL fragments of the alert table (backticked, naming a metric, not a command)."""
    text = OBSERVABILITY.read_text(encoding="utf-8")
    table = text.split("## Alerts that matter", 1)[1].split("\n\n", 1)[0]
    found = []
    for row in table.splitlines()[2:]:
        expression = row.split(" | ")[1]
        found += [
            code
            for code in re.findall(r"`([^`]+)`", expression)
            if METRIC.search(code) and not code.startswith("outboxkit ")
        ]
    return found


def test_every_rule_names_metrics_the_code_exports() -> None:
    known = exported()
    for rule in rules():
        unknown = set(METRIC.findall(rule["expr"])) - known
        assert not unknown, f"{rule['alert']}: no such metric {sorted(unknown)}"


def test_the_rules_are_the_alert_table_of_observability_md() -> None:
    expressions = [rule["expr"] for rule in rules()]
    fragments = table_expressions()
    assert fragments, "the alert table was not found"
    for fragment in fragments:
        assert any(fragment in expr for expr in expressions), f"no rule for `{fragment}`"
    for rule in rules():
        assert any(fragment in rule["expr"] for fragment in fragments), (
            f"{rule['alert']} is in no row of the table"
        )
    known = exported()
    for fragment in fragments:
        assert set(METRIC.findall(fragment)) <= known, fragment
