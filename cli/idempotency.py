"""``outboxkit idempotency``: housekeeping of the HTTP ``Idempotency-Key`` table."""

from __future__ import annotations

import asyncio
import json

import typer
from outboxkit.cli.options import DbUrlOption, JsonOption, settings_from
from outboxkit.idempotency.cleanup import purge_expired
from outboxkit.outbox.db import make_async_engine
from sqlalchemy.ext.asyncio import async_sessionmaker

idempotency_app = typer.Typer(
    help="HTTP Idempotency-Key records: clean up expired keys.", no_args_is_help=True
)


@idempotency_app.command("purge")
def purge_command(
    chunk_size: int = typer.Option(1000, "--chunk-size", min=1, max=100_000),
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
) -> None:
    """Delete expired keys (not those still in progress under a live lease), in chunks."""
    settings = settings_from(db_url)

    async def purge() -> int:
        engine = make_async_engine(settings.db_url)
        try:
            return await purge_expired(
                async_sessionmaker(engine, expire_on_commit=False), chunk_size=chunk_size
            )
        finally:
            await engine.dispose()

    deleted = asyncio.run(purge())
    typer.echo(json.dumps({"deleted": deleted}) if as_json else f"deleted: {deleted}")
