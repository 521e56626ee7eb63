"""HTTP idempotency keys: the server side of the ``Idempotency-Key`` header.

Revision ID: 0007_http_idempotency
Revises: 0006_action_notify
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_http_idempotency"
down_revision = "0006_action_notify"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``http_idempotency_keys``, unique by (scope, key)."""
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "http_idempotency_keys",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("scope", sa.String(128), nullable=False),
        sa.Column("idem_key", sa.String(255), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("fingerprint_parts", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("lease_token", sa.String(36), nullable=True),
        sa.Column("lease_expires_ms", sa.BigInteger, nullable=True),
        sa.Column("response_status", sa.Integer, nullable=True),
        sa.Column("response_headers", sa.Text, nullable=True),
        sa.Column("response_body", sa.LargeBinary, nullable=True),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("completed_ms", sa.BigInteger, nullable=True),
        sa.Column("expires_ms", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("scope", "idem_key", name="uq_http_idempotency_keys_scope_key"),
    )
    op.create_index("ix_http_idempotency_keys_expires", "http_idempotency_keys", ["expires_ms"])


def downgrade() -> None:
    """Drop what :func:`upgrade` created."""
    op.drop_table("http_idempotency_keys")
