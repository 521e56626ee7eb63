"""``outboxkit migrate``: create or upgrade outboxkit's tables."""

from __future__ import annotations

import typer
from outboxkit.cli.options import DbUrlOption, settings_from
from outboxkit.migrations.runner import upgrade


def migrate(db_url: str | None = DbUrlOption) -> None:
    """Create or upgrade outboxkit's tables (version table alembic_version_outboxkit)."""
    upgrade(settings_from(db_url).db_url)
    typer.echo("migrated")
