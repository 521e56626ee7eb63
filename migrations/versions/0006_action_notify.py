"""Notify waiters when an agent operation changes state (PostgreSQL only).

Revision ID: 0006_action_notify
Revises: 0005_outbox_no_row_leases
Create Date: 2026-12-01

A worker that finds an operation RUNNING under another worker's lease waits for it; with this
trigger it wakes at the commit of the change instead of at its next poll. The payload is the
operation's row id, so a waiter wakes for its own operation only. A row trigger with a WHEN
condition, unlike the outbox's statement trigger: heartbeats update ``lease_expires_ms`` every
few seconds and must not wake every waiter of every operation.
"""

from alembic import op
from outboxkit.outbox.dialects import dialect_of

revision = "0006_action_notify"
down_revision = "0005_outbox_no_row_leases"
branch_labels = None
depends_on = None

NOTIFY_CHANNEL = "outboxkit_actions"  # outboxkit.actions.waiting.CHANNEL


def upgrade() -> None:
    """Create the function and the two triggers (insert; update of state, generation, attempt)."""
    if not dialect_of(op.get_bind()).listen_notify:
        return
    op.execute(
        f"""
        CREATE FUNCTION outboxkit_notify_action() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{NOTIFY_CHANNEL}', NEW.id::text);
            RETURN NULL;
        END $$;
        """
    )
    op.execute(
        "CREATE TRIGGER outboxkit_action_notify_insert AFTER INSERT ON agent_operations "
        "FOR EACH ROW EXECUTE FUNCTION outboxkit_notify_action()"
    )
    op.execute(
        "CREATE TRIGGER outboxkit_action_notify_update AFTER UPDATE ON agent_operations "
        "FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state "
        "OR OLD.generation IS DISTINCT FROM NEW.generation "
        "OR OLD.attempts IS DISTINCT FROM NEW.attempts) "
        "EXECUTE FUNCTION outboxkit_notify_action()"
    )


def downgrade() -> None:
    """Drop the triggers and the function."""
    if not dialect_of(op.get_bind()).listen_notify:
        return
    op.execute("DROP TRIGGER IF EXISTS outboxkit_action_notify_update ON agent_operations")
    op.execute("DROP TRIGGER IF EXISTS outboxkit_action_notify_insert ON agent_operations")
    op.execute("DROP FUNCTION IF EXISTS outboxkit_notify_action()")
