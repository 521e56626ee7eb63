"""``outboxkit consume MODULE:APP``: run a consumer app until SIGTERM."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from pathlib import Path

import typer
from outboxkit.cli.errors import CliError
from outboxkit.cli.options import (
    BootstrapOption,
    DbUrlOption,
    SaslMechanismOption,
    SaslUsernameOption,
    SecurityProtocolOption,
    SslCafileOption,
    SslCertfileOption,
    SslKeyfileOption,
    kafka_from,
    settings_from,
)
from outboxkit.consumers.app import ConsumerApp
from outboxkit.consumers.metrics import RuntimeCollector
from outboxkit.consumers.runtime import ConsumerRuntime, serve
from outboxkit.outbox.logs import configure_logging
from outboxkit.outbox.metrics_server import DEFAULT_ADDRESS, serve_metrics
from prometheus_client import REGISTRY

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def load_app(target: str) -> ConsumerApp:
    """Import ``module:attribute`` and return the :class:`ConsumerApp` it names."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise CliError(f"expected MODULE:APP (e.g. billing.consumers:app), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would, so local modules import
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise CliError(f"cannot import module {module_name!r}: {error}") from None
    found = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise CliError(f"module {module_name!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    if not isinstance(found, ConsumerApp):
        raise CliError(f"{target} is a {type(found).__name__}, not a consumers.ConsumerApp")
    if not found.handlers:
        raise CliError(f"{target} has no handlers")
    return found


def consume(
    target: str = typer.Argument(..., metavar="MODULE:APP", help="The ConsumerApp to run."),
    db_url: str | None = DbUrlOption,
    bootstrap: str | None = BootstrapOption,
    security_protocol: str | None = SecurityProtocolOption,
    sasl_mechanism: str | None = SaslMechanismOption,
    sasl_username: str | None = SaslUsernameOption,
    ssl_cafile: Path | None = SslCafileOption,
    ssl_certfile: Path | None = SslCertfileOption,
    ssl_keyfile: Path | None = SslKeyfileOption,
    group: str | None = typer.Option(
        None, "--group", help="Kafka consumer group (default: the app's group or name)."
    ),
    unhandled: str | None = typer.Option(
        None, "--unhandled", help="Events without a handler: skip or dead-letter."
    ),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
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
) -> int:
    """Consume events with MODULE:APP's handlers; SIGTERM drains and exits 0."""
    level = log_level.upper()
    if level not in LOG_LEVELS:
        raise CliError(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    if unhandled is not None and unhandled not in ("skip", "dead-letter"):
        raise CliError("--unhandled must be 'skip' or 'dead-letter'")
    consumer_app = load_app(target)
    if unhandled is not None:
        consumer_app.unhandled = unhandled  # type: ignore[assignment]
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
    configure_logging(level)
    runtime = ConsumerRuntime(consumer_app, kafka=kafka, db_url=settings.db_url, group=group)
    if metrics_port is not None:
        REGISTRY.register(RuntimeCollector(runtime))
        serve_metrics(metrics_port, metrics_address, runtime.readiness)
    asyncio.run(serve(runtime))
    return 0
