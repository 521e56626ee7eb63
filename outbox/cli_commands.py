"""``outboxkit migrate`` and ``outboxkit dev kafka``."""

from __future__ import annotations

import signal
import threading

import typer

from outbox.cli import app, dev_app
from outbox.settings import Settings

DbUrlOption = typer.Option(None, "--db-url", help="Database URL [env: OUTBOXKIT_DB_URL].")


def settings_from(db_url: str | None = None, kafka_bootstrap: str | None = None) -> Settings:
    """Settings from the environment, overridden by the flags that were given."""
    overrides = {"db_url": db_url, "kafka_bootstrap": kafka_bootstrap}
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


@app.command()
def migrate(db_url: str | None = DbUrlOption) -> None:
    """Create or upgrade outboxkit's tables (version table alembic_version_outboxkit)."""
    from outbox.migrate import upgrade

    settings = settings_from(db_url)
    upgrade(settings.db_url)
    typer.echo("migrated")


@dev_app.command("kafka")
def dev_kafka(
    port: int = typer.Option(0, "--port", help="Broker port on 127.0.0.1 (0: a free one)."),
    auto_create_topics: bool = typer.Option(True, help="Let the broker create topics on use."),
) -> None:
    """Run a real single-node Apache Kafka broker until SIGTERM or Ctrl-C."""
    from outbox.dev.kafka import KafkaBroker

    if port < 0 or port > 65535:
        raise typer.BadParameter(f"port {port} is out of range 0-65535", param_hint="--port")
    broker = KafkaBroker(port=port or None, auto_create_topics=auto_create_topics)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    broker.start()
    typer.echo(f"ready: {broker.bootstrap}", err=False)
    try:
        stop.wait()
    finally:
        broker.close()
