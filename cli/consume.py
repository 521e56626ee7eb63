"""``outboxkit consume MODULE:APP``: run a consumer app until SIGTERM.

SIGTERM and SIGINT are handled before anything else: a signal while the app is imported or the
runtime connects stops it cleanly (exit 0). When handlers are still running at the stop
deadline (``--stop-timeout``), the command logs them and exits with code 4 at once, without
waiting for threads that cannot be stopped; a watchdog thread does the same a little later if
the event loop itself is blocked (a sync handler holding it).

The process tunes Python's cyclic garbage collector once started up (:func:`tune_gc`): a
library must not do that to its host's heap, but this process is the consumer's own.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
import time
from pathlib import Path

import typer
from outboxkit.cli import signals as early_signals
from outboxkit.cli.errors import EXIT_HANDLER_INTERRUPTED, EXIT_OK, EXIT_STOPPED_STUCK, CliError
from outboxkit.cli.options import (
    BootstrapOption,
    DbUrlOption,
    JsonLogsOption,
    LogLevelOption,
    SaslMechanismOption,
    SaslUsernameOption,
    SecurityProtocolOption,
    SslCafileOption,
    SslCertfileOption,
    SslKeyfileOption,
    duration_option,
    import_target,
    kafka_from,
    settings_from,
)
from outboxkit.consumers.app import ConsumerApp
from outboxkit.consumers.apply import HandlerInterrupt
from outboxkit.consumers.errors import StopTimeoutError
from outboxkit.consumers.metrics import RuntimeCollector
from outboxkit.consumers.runtime import DEFAULT_STOP_TIMEOUT_S, ConsumerRuntime, serve
from outboxkit.consumers.signals import StopSignals
from outboxkit.consumers.stall import DEFAULT_STALL_AFTER_S
from outboxkit.outbox.logs import configure_logging
from outboxkit.outbox.metrics_server import DEFAULT_ADDRESS, serve_metrics
from prometheus_client import REGISTRY

WATCHDOG_GRACE_S = 15.0  # past the stop deadline, for the runtime's own handling to finish

log = logging.getLogger("outboxkit.consumer")


def load_app(target: str) -> ConsumerApp:
    """Import ``module:attribute`` and return the :class:`ConsumerApp` it names."""
    found = import_target(target, "MODULE:APP", "billing.consumers:app")
    if not isinstance(found, ConsumerApp):
        raise CliError(f"{target} is a {type(found).__name__}, not an outboxkit ConsumerApp")
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
    log_level: str = LogLevelOption,
    json_logs: bool = JsonLogsOption,
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
    stop_timeout: float = duration_option(
        DEFAULT_STOP_TIMEOUT_S,
        "--stop-timeout",
        minimum_s=0.1,
        help="How long SIGTERM waits for running handlers; then exit 4 naming them.",
    ),
    stall_after: float = duration_option(
        DEFAULT_STALL_AFTER_S,
        "--stall-after",
        minimum_s=0.1,
        help="Stalled (a log line, /readyz 503, outboxkit_consumer_stalled 1) when a partition "
        "lags with no offset committed for this long.",
    ),
) -> int:
    """Consume events with MODULE:APP's handlers; SIGTERM drains and exits 0."""
    signals = StopSignals().install()  # first: a signal while starting up is a clean stop
    if early_signals.requested():  # main() held one since the process began
        signals.event.set()
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
    configure_logging(log_level, json_lines=json_logs)
    runtime = ConsumerRuntime(
        consumer_app,
        kafka=kafka,
        db_url=settings.db_url,
        group=group,
        stop_timeout_s=stop_timeout,
        stall_after_s=stall_after,
    )
    if metrics_port is not None:
        REGISTRY.register(RuntimeCollector(runtime))
        serve_metrics(metrics_port, metrics_address, runtime.readiness)
    _start_watchdog(runtime, signals, stop_timeout + WATCHDOG_GRACE_S)
    tune_gc()
    return asyncio.run(_serve(runtime, signals))


def tune_gc() -> None:
    """Set up the garbage collector of a consumer process that has loaded its app.

    Everything loaded so far (the libraries, the app) is frozen out of the collector's sight
    (``gc.freeze``): the full collections that a chunk's short-lived records cause no longer
    walk those objects again, which was about a fifth of the runtime's CPU (bench/README.md).
    The collection thresholds stay Python's: raising the young threshold to 50,000 objects
    made it faster still, but let cyclic garbage pile up to 1.4 GB of resident memory over a
    backlog of 1,000,000 records (bench.memory), against 110 MB with the freeze alone.
    """
    gc.collect()
    gc.freeze()


async def _serve(runtime: ConsumerRuntime, signals: StopSignals) -> int:
    try:
        await serve(runtime, signals)
    except StopTimeoutError:
        # Handlers were cancelled, but one running in a thread cannot be: leaving asyncio.run
        # would wait for it forever. The runtime has logged what was stuck and closed.
        _exit_now(EXIT_STOPPED_STUCK)
    except HandlerInterrupt:
        # The runtime logged the record and closed without committing past it.
        return EXIT_HANDLER_INTERRUPTED
    return EXIT_OK


def _start_watchdog(runtime: ConsumerRuntime, signals: StopSignals, after_s: float) -> None:
    """Exit with code 4 if the process is still there ``after_s`` seconds after a stop signal.

    For an event loop blocked by a handler (a sync handler with a ``Session`` runs on it),
    where the runtime's own stop deadline cannot fire.
    """

    def watch() -> None:
        signals.event.wait()
        time.sleep(after_s)  # a daemon thread: it ends with the process if that exits first
        calls = runtime.in_flight()
        for call in calls:
            log.error("stop deadline passed: %s", call.describe())
        log.error(
            "still running %g s after the stop signal (%d handler call(s)); exiting",
            after_s,
            len(calls),
        )
        _exit_now(EXIT_STOPPED_STUCK)

    threading.Thread(target=watch, name="outboxkit-stop-watchdog", daemon=True).start()


def _exit_now(code: int) -> None:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
