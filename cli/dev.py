"""``outboxkit dev kafka``: a real single-node Apache Kafka broker for development."""

from __future__ import annotations

import signal
import threading

import typer
from outboxkit.cli import signals
from outboxkit.cli.errors import CliError
from outboxkit.testing.kafka import SECURITY_MODES, KafkaBroker, KafkaLauncherError

# How often the command checks that its broker still runs (a dead one ends it with exit 2).
WATCH_INTERVAL_S = 1.0

dev_app = typer.Typer(help="Development helpers.", no_args_is_help=True)


@dev_app.command("kafka")
def dev_kafka(
    port: int = typer.Option(0, "--port", help="Broker port on 127.0.0.1 (0: a free one)."),
    auto_create_topics: bool = typer.Option(True, help="Let the broker create topics on use."),
    security: str | None = typer.Option(
        None,
        "--security",
        help="Secure the client listener: ssl (TLS), mtls (TLS + client certificates) or "
        "sasl_ssl (TLS + SCRAM users), with a throwaway CA.",
    ),
) -> None:
    """Run a real single-node Apache Kafka broker until SIGTERM or Ctrl-C (both exit 0).

    Prints ``ready: BOOTSTRAP``, then (with ``--security``) the OUTBOXKIT_KAFKA_* settings a
    client needs, as shell ``export`` lines.
    """
    if port < 0 or port > 65535:
        raise typer.BadParameter(f"port {port} is out of range 0-65535", param_hint="--port")
    mode = security.lower() if security else None
    if mode is not None and mode not in SECURITY_MODES:
        raise typer.BadParameter(
            f"{security!r} is not one of {', '.join(SECURITY_MODES)}", param_hint="--security"
        )
    stop = threading.Event()
    for signum in signals.STOP_SIGNALS:
        signal.signal(signum, lambda *_: stop.set())
    if signals.requested():
        return  # stopped while starting up (main() held the signals): exit 0, no broker
    broker = KafkaBroker(port=port or None, auto_create_topics=auto_create_topics, security=mode)
    failed = False
    try:
        try:
            broker.start()
        except KafkaLauncherError as error:
            failed = True
            raise CliError(f"dev kafka: {_first_line(error)}") from None
        typer.echo(f"ready: {broker.bootstrap}", err=False)
        if mode is not None:
            for line in client_exports(broker):
                typer.echo(line)
        while not stop.wait(WATCH_INTERVAL_S):
            if broker.exit_code is not None:
                failed = True
                raise CliError(
                    f"dev kafka: the broker exited with {broker.exit_code}; see {broker.log_file}"
                )
    finally:
        broker.stop()
        if not (failed and broker.log_file.exists()):  # a failed broker's log stays to be read
            broker.close()


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0].rstrip(":") if lines else type(error).__name__


def client_exports(broker: KafkaBroker) -> list[str]:
    """``export OUTBOXKIT_KAFKA_...=...`` lines for a client of ``broker``.

    They include the throwaway password and key passphrase on purpose: this broker and its
    CA live only as long as the command, and a client cannot connect without them.
    """
    kafka = broker.kafka
    lines = [
        f"export OUTBOXKIT_KAFKA_{name.upper()}={value}" for name, value in kafka.describe().items()
    ]
    secrets = {"sasl_password": kafka.sasl_password, "ssl_key_password": kafka.ssl_key_password}
    shown = [
        f"export OUTBOXKIT_KAFKA_{name.upper()}={value.get_secret_value()}"
        for name, value in secrets.items()
        if value is not None
    ]
    if shown:
        lines.append("# throwaway development secrets, valid only for this broker:")
    return lines + shown
