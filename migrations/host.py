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
        "inbox_windows",
        "outbox_events",
        "outbox_relays",
        "outbox_shard_leases",
        "outbox_slot_catch_ups",
        "outbox_slot_gaps",
        "outbox_slot_positions",
        "workflow_history",
        "workflow_instances",
        "workflow_signals",
    }
)
"""Every table outboxkit's migrations create, its version table included."""

PARTITION_PREFIX = "inbox_events_"
"""The inbox's tables on PostgreSQL besides ``inbox_events``: its partitions
(``inbox_events_p<ms>``, ``_default``, ``_untimed``), which consumers create and drop as time
goes by, and ``inbox_events_unpartitioned`` (the inbox from before them)."""


def _ours(name: str | None) -> bool:
    return name is not None and (name in TABLES or name.startswith(PARTITION_PREFIX))


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
        return not _ours(name)
    table = getattr(object, "table", None)
    return not _ours(getattr(table, "name", None))
