"""``outboxkit migrate``: create or upgrade outboxkit's tables."""

from __future__ import annotations

import asyncio
import json

import typer
from outboxkit.cli.options import DbUrlOption, JsonOption, settings_from
from outboxkit.migrations.runner import upgrade
from outboxkit.ops.access import ping_database
from outboxkit.outbox.db import parse_url
from outboxkit.outbox.dialects import dialect_of


def migrate(db_url: str | None = DbUrlOption, as_json: bool = JsonOption) -> None:
    """Create or upgrade outboxkit's tables (version table alembic_version_outboxkit)."""
    url = settings_from(db_url).db_url
    if not dialect_of(parse_url(url)).file_database:
        # through the driver every other command uses: a refused connection (TLS, password)
        # is worded as theirs are, not as psycopg's libpq text
        asyncio.run(ping_database(url))
    upgrade(url)
    typer.echo(json.dumps({"migrated": True}) if as_json else "migrated")
