"""``outboxkit migrate``: create or upgrade outboxkit's tables."""

from __future__ import annotations

import json

import typer
from outboxkit.cli.options import DbUrlOption, JsonOption, settings_from
from outboxkit.migrations.runner import upgrade


def migrate(db_url: str | None = DbUrlOption, as_json: bool = JsonOption) -> None:
    """Create or upgrade outboxkit's tables (version table alembic_version_outboxkit)."""
    upgrade(settings_from(db_url).db_url)
    typer.echo(json.dumps({"migrated": True}) if as_json else "migrated")
