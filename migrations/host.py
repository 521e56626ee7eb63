"""What a host application's Alembic ``env.py`` needs to leave outboxkit's tables alone.

outboxkit's tables live in the host's database but belong to outboxkit's own history
(``alembic_version_outboxkit``); without a filter, the host's ``alembic revision
--autogenerate`` sees them in the database and not in its models, and proposes to drop them.
Pass :func:`include_object` to ``context.configure(include_object=...)`` (docs/deploy.md).
"""

from __future__ import annotations

from typing import Any

from outboxkit.migrations.runner import VERSION_TABLE

TABLES: frozenset[str] = frozenset(
    {
        VERSION_TABLE,
        "agent_operation_audit",
        "agent_operations",
        "console_audit",
        "consumer_held_events",
        "consumer_sequences",
        "dlq_discards",
        "dlq_replays",
        "http_idempotency_keys",
        "inbox_events",
        "outbox_events",
        "outbox_relays",
        "outbox_shard_leases",
        "outbox_slot_catch_ups",
        "workflow_history",
        "workflow_instances",
        "workflow_signals",
    }
)
"""Every table outboxkit's migrations create, its version table included."""


def include_object(
    object: Any,
    name: str | None,
    type_: str,
    reflected: bool,
    compare_to: Any,
) -> bool:
    """Alembic's ``include_object`` hook: ``False`` for outboxkit's tables and everything on
    them (columns, indexes, constraints), ``True`` for the rest."""
    if type_ == "table":
        return name not in TABLES
    table = getattr(object, "table", None)
    return getattr(table, "name", None) not in TABLES
