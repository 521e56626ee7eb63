"""``outboxkit dev kafka``: a real single-node Apache Kafka broker for development."""

from __future__ import annotations

import signal
import threading

import typer
from outboxkit.cli import signals
from outboxkit.testing.kafka import KafkaBroker

dev_app = typer.Typer(help="Development helpers.", no_args_is_help=True)


@dev_app.command("kafka")
def dev_kafka(
    port: int = typer.Option(0, "--port", help="Broker port on 127.0.0.1 (0: a free one)."),
    auto_create_topics: bool = typer.Option(True, help="Let the broker create topics on use."),
) -> None:
    """Run a real single-node Apache Kafka broker until SIGTERM or Ctrl-C (both exit 0)."""
    if port < 0 or port > 65535:
        raise typer.BadParameter(f"port {port} is out of range 0-65535", param_hint="--port")
    stop = threading.Event()
    for signum in signals.STOP_SIGNALS:
        signal.signal(signum, lambda *_: stop.set())
    if signals.requested():
        return  # stopped while starting up (main() held the signals): exit 0, no broker
    broker = KafkaBroker(port=port or None, auto_create_topics=auto_create_topics)
    broker.start()
    typer.echo(f"ready: {broker.bootstrap}", err=False)
    try:
        stop.wait()
    finally:
        broker.close()
