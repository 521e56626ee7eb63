"""``outboxkit relay``: run a relay process until SIGTERM (or, with ``--drain``, until idle)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import typer
from outboxkit.cli import signals
from outboxkit.cli.options import (
    BootstrapOption,
    SaslMechanismOption,
    SaslUsernameOption,
    SecurityProtocolOption,
    SslCafileOption,
    SslCertfileOption,
    SslKeyfileOption,
    kafka_from,
    settings_from,
)
from outboxkit.ops.access import ping_database
from outboxkit.outbox.logs import configure_logging
from outboxkit.outbox.metrics_server import DEFAULT_ADDRESS, serve_metrics
from outboxkit.relay import Relay, RelayOptions


def relay(
    db_url: str | None = typer.Option(None, "--db-url", help="[env: OUTBOXKIT_DB_URL]"),
    bootstrap: str | None = BootstrapOption,
    security_protocol: str | None = SecurityProtocolOption,
    sasl_mechanism: str | None = SaslMechanismOption,
    sasl_username: str | None = SaslUsernameOption,
    ssl_cafile: Path | None = SslCafileOption,
    ssl_certfile: Path | None = SslCertfileOption,
    ssl_keyfile: Path | None = SslKeyfileOption,
    batch_size: int = typer.Option(500, min=1, max=10_000, help="Rows per claim."),
    lease_ttl: float = typer.Option(
        30.0,
        help="Seconds a dead relay blocks its shards; at least twice --request-timeout-ms "
        "(20 with its default).",
    ),
    poll_interval: float = typer.Option(1.0, min=0.01, help="Seconds between polls."),
    max_attempts: int = typer.Option(10, min=1, help="Failed publishes before a row is parked."),
    retention: float = typer.Option(
        7 * 24 * 3600.0, min=0.0, help="Seconds to keep published rows; 0 deletes at once."
    ),
    request_timeout_ms: int = typer.Option(10_000, min=1000, help="Kafka request timeout."),
    max_request_size: int = typer.Option(
        1024 * 1024, min=1024, help="Largest record in bytes; a larger row fails and is parked."
    ),
    drain: bool = typer.Option(False, "--drain", help="Exit once nothing is pending."),
    no_listen: bool = typer.Option(False, "--no-listen", help="Poll only, no LISTEN/NOTIFY."),
    json_logs: bool = typer.Option(False, "--json-logs", help="Log JSON lines."),
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        min=1,
        max=65535,
        help="Serve /metrics, /healthz and /readyz on this port.",
    ),
    metrics_address: str = typer.Option(
        DEFAULT_ADDRESS, "--metrics-address", help="Address to serve them on (0.0.0.0: all)."
    ),
) -> None:
    """Publish committed outbox rows to Kafka until SIGTERM (exit 0)."""
    configure_logging(json_lines=json_logs)
    settings = settings_from(db_url)
    kafka = kafka_from(
        bootstrap,
        security_protocol,
        sasl_mechanism,
        sasl_username,
        ssl_cafile,
        ssl_certfile,
        ssl_keyfile,
    )
    shortest_lease_s = 2 * request_timeout_ms / 1000
    if lease_ttl < shortest_lease_s:
        raise typer.BadParameter(
            f"{lease_ttl:g} is below {shortest_lease_s:g}, twice --request-timeout-ms "
            f"({request_timeout_ms} ms): a batch in flight must not outlive its lease",
            param_hint="--lease-ttl",
        )
    try:
        options = RelayOptions(
            batch_size=batch_size,
            lease_ttl_s=lease_ttl,
            poll_interval_s=poll_interval,
            max_attempts=max_attempts,
            retention_s=retention,
            request_timeout_s=request_timeout_ms / 1000,
            max_request_size=max_request_size,
            listen=not no_listen,
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    relay_process = Relay(db_url=settings.db_url, kafka=kafka, options=options)
    if metrics_port is not None:
        serve_metrics(metrics_port, metrics_address, relay_process.readiness)
    if drain:  # a one-off run fails fast on a misconfigured database instead of retrying
        asyncio.run(ping_database(settings.db_url))
    asyncio.run(_run(relay_process, drain))


async def _run(relay_process: Relay, drain: bool) -> None:
    """Relay (or drain) until SIGTERM or SIGINT, which stop it gracefully (exit 0).

    ``main()`` held both signals since the process began; a stop that came during start-up
    means the relay never starts. Its ``relay <id> started`` line is logged only after these
    handlers are in place, so whoever waits for that line may stop it at once.
    """
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    def stop() -> None:
        # run()/drain() below report the work's failure; this task only asks it to stop.
        stopping.append(loop.create_task(_stop_quietly(relay_process)))

    for signum in signals.STOP_SIGNALS:
        loop.add_signal_handler(signum, stop)
    try:
        if signals.requested():
            return  # stopped while starting up: nothing began, nothing to finish
        if drain:
            await relay_process.drain(timeout_s=None)
        else:
            await relay_process.run()
        await asyncio.gather(*stopping)
    finally:
        for signum in signals.STOP_SIGNALS:
            loop.remove_signal_handler(signum)
        signals.hold_again()  # not the defaults while the loop and the interpreter wind down


async def _stop_quietly(relay_process: Relay) -> None:
    with contextlib.suppress(Exception):
        await relay_process.stop()
