"""``outboxkit dev kafka``: a real Apache Kafka broker, or a three-node cluster, for development."""

from __future__ import annotations

import signal
import threading

import typer
from outboxkit.cli import signals
from outboxkit.cli.errors import CliError
from outboxkit.testing.kafka import SECURITY_MODES, KafkaBroker, KafkaLauncherError
from outboxkit.testing.kafka_cluster import KafkaCluster

# How often the command checks that its broker still runs (a dead one ends it with exit 2).
WATCH_INTERVAL_S = 1.0

dev_app = typer.Typer(help="Development helpers.", no_args_is_help=True)


@dev_app.command("kafka")
def dev_kafka(
    port: int = typer.Option(
        0,
        "--port",
        help="Broker port on 127.0.0.1 (0: a free one); with --brokers N, the first of N "
        "ports in a row.",
    ),
    brokers: int = typer.Option(
        1,
        "--brokers",
        help="1: one broker; 3: a KRaft cluster of three nodes (replication factor 3, "
        "min.insync.replicas 2).",
    ),
    auto_create_topics: bool = typer.Option(True, help="Let the broker create topics on use."),
    security: str | None = typer.Option(
        None,
        "--security",
        help="Secure the client listener: ssl (TLS), mtls (TLS + client certificates) or "
        "sasl_ssl (TLS + SCRAM users), with a throwaway CA.",
    ),
) -> None:
    """Run a real Apache Kafka broker (or, with ``--brokers 3``, a three-node cluster) until
    SIGTERM or Ctrl-C (both exit 0).

    Prints ``ready: BOOTSTRAP``, then (with ``--security``) the OUTBOXKIT_KAFKA_* settings a
    client needs, as shell ``export`` lines; a cluster also prints one ``node`` line per node
    (its id, address and process id, for the faults you inject by hand).
    """
    if brokers not in (1, 3):
        raise typer.BadParameter(f"{brokers} brokers: give 1 or 3", param_hint="--brokers")
    if port < 0 or port + brokers - 1 > 65535:
        raise typer.BadParameter(f"port {port} is out of range 0-65535", param_hint="--port")
    mode = security.lower() if security else None
    if mode is not None and mode not in SECURITY_MODES:
        raise typer.BadParameter(
            f"{security!r} is not one of {', '.join(SECURITY_MODES)}", param_hint="--security"
        )
    if mode is not None and brokers > 1:
        raise typer.BadParameter("--security works with one broker only", param_hint="--security")
    if brokers > 1:
        ports = list(range(port, port + brokers)) if port else None
        _run_cluster(KafkaCluster(brokers, auto_create_topics=auto_create_topics, ports=ports))
        return
    stop = _stop_on_signal()
    if stop is None:
        return
    broker = KafkaBroker(port=port or None, auto_create_topics=auto_create_topics, security=mode)
    failed = False
    try:
        _start(broker)
        typer.echo(f"ready: {broker.bootstrap}", err=False)
        if mode is not None:
            for line in client_exports(broker):
                typer.echo(line)
        while not stop.wait(WATCH_INTERVAL_S):
            if broker.exit_code is not None:
                raise CliError(
                    f"dev kafka: the broker exited with {broker.exit_code}; see {broker.log_file}"
                )
    except CliError:
        failed = True
        raise
    finally:
        broker.stop()
        if not (failed and broker.log_file.exists()):  # a failed broker's log stays to be read
            broker.close()


def _run_cluster(cluster: KafkaCluster) -> None:
    """Start ``cluster``, print where it listens, and keep it until a stop signal.

    A node that ends meanwhile (``kill -9 PID`` tries a crash by hand; ``kill -STOP`` and
    ``kill -CONT`` freeze and thaw one) is started again on its ports with its data, and a
    line on stderr says so; a node that cannot start again ends the command with exit 2.
    """
    stop = _stop_on_signal()
    if stop is None:
        return
    failed = False
    try:
        _start(cluster)
        typer.echo(f"ready: {cluster.bootstrap}")
        for node in cluster.nodes:
            typer.echo(f"node {node.node_id}: {node.bootstrap} pid {node.pid} log {node.log_file}")
        typer.echo(
            f"started in {cluster.start_seconds:.1f} s; replication factor {cluster.replication}, "
            f"min.insync.replicas {cluster.nodes[0].min_insync}"
        )
        while not stop.wait(WATCH_INTERVAL_S):
            for node in cluster.nodes:
                code = node.exit_code
                if code is None:
                    continue
                typer.echo(f"node {node.node_id} exited with {code}; starting it again", err=True)
                node.stop()
                _start(node, f"node {node.node_id}: ")
                typer.echo(f"node {node.node_id}: {node.bootstrap} pid {node.pid} (restarted)")
    except CliError:
        failed = True
        raise
    finally:
        cluster.stop()
        if not failed:  # a failed cluster's logs stay to be read
            cluster.close()


def _stop_on_signal() -> threading.Event | None:
    """An event SIGTERM and SIGINT set; ``None`` when one came during start-up (main() held
    the signals): the command then exits 0 having started nothing."""
    stop = threading.Event()
    for signum in signals.STOP_SIGNALS:
        signal.signal(signum, lambda *_: stop.set())
    return None if signals.requested() else stop


def _start(server: KafkaBroker | KafkaCluster, which: str = "") -> None:
    """Start ``server``; a launcher error becomes one line (exit 2)."""
    try:
        server.start()
    except KafkaLauncherError as error:
        raise CliError(f"dev kafka: {which}{_first_line(error)}") from None


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
