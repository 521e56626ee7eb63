"""Alembic migrations of outboxkit's tables (version table ``alembic_version_outboxkit``)."""
