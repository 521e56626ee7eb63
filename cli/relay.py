"""``outboxkit relay``: run a relay process until SIGTERM (or, with ``--drain``, until idle)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from pathlib import Path

import typer
from outboxkit.cli import signals
from outboxkit.cli.errors import CliError
from outboxkit.cli.options import (
    BootstrapOption,
    JsonLogsOption,
    LogLevelOption,
    SaslMechanismOption,
    SaslUsernameOption,
    SecurityProtocolOption,
    SslCafileOption,
    SslCertfileOption,
    SslKeyfileOption,
    duration_option,
    kafka_from,
    settings_from,
)
from outboxkit.cli.progress import ProgressReport
from outboxkit.ops.access import DEFAULT_TIMEOUT_S, ops_engine, ping_database
from outboxkit.ops.outbox_rows import count_rows
from outboxkit.outbox.db import make_async_engine, parse_url, require_tables
from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.logs import configure_logging
from outboxkit.outbox.metrics_server import DEFAULT_ADDRESS, serve_metrics
from outboxkit.relay import Relay, RelayOptions
from outboxkit.relay.publisher import KafkaUnavailable, Publisher
from outboxkit.relay.runner import RELAY_TABLES
from outboxkit.relay.slot import Slot, default_slot_name, refusal, require_logical
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

PROGRESS_TICK_S = 0.5


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
    lease_ttl: float = duration_option(
        30.0,
        "--lease-ttl",
        help="How long a dead relay blocks its shards; at least twice --request-timeout "
        "(20s with its default).",
    ),
    poll_interval: float = duration_option(
        1.0, "--poll-interval", minimum_s=0.01, help="Time between polls."
    ),
    max_attempts: int = typer.Option(10, min=1, help="Failed publishes before a row is parked."),
    retention: float = duration_option(
        7 * 24 * 3600.0,
        "--retention",
        minimum_s=0.0,
        help="How long to keep published rows (7d); 0 deletes at once.",
    ),
    request_timeout: float = duration_option(
        10.0, "--request-timeout", minimum_s=1.0, help="Kafka request timeout."
    ),
    request_timeout_ms: int | None = typer.Option(
        None, "--request-timeout-ms", min=1000, hidden=True, help="Deprecated: --request-timeout."
    ),
    max_request_size: int = typer.Option(
        1024 * 1024, min=1024, help="Largest record in bytes; a larger row fails and is parked."
    ),
    mode: str = typer.Option(
        "poll",
        "--mode",
        help="poll: claim rows from the table (any database); logical: read committed inserts "
        "from a replication slot (PostgreSQL with wal_level=logical).",
    ),
    logical_reader: str = typer.Option(
        "stream",
        "--logical-reader",
        help="--mode logical: stream (replication protocol, one session) or sql "
        "(pg_logical_slot_peek_binary_changes per read; slower).",
    ),
    slot: str | None = typer.Option(
        None, "--slot", help="Replication slot of --mode logical [default: outboxkit_<database>]."
    ),
    drop_slot: bool = typer.Option(
        False,
        "--drop-slot",
        help="Drop the --mode logical slot and exit (stop the relays first; the next relay "
        "recreates it and publishes the unpublished rows from the table).",
    ),
    stall_after: float = duration_option(
        60.0,
        "--stall-after",
        minimum_s=0.1,
        help="Stalled (a log line, /readyz 503, outboxkit_relay_stalled 1) when a row has been "
        "due on its shards this long and nothing was published for as long.",
    ),
    max_slot_lag_bytes: int | None = typer.Option(
        None,
        "--max-slot-lag-bytes",
        min=0,
        help="--mode logical: not ready (a log line, /readyz 503) while the slot lags more "
        "bytes [default: no limit; an invalidated slot always counts].",
    ),
    drain: bool = typer.Option(False, "--drain", help="Exit once nothing is pending."),
    timeout: float | None = duration_option(
        None,
        "--timeout",
        minimum_s=0.001,
        help="--drain: give up (one line, exit 2) if not drained within this duration "
        "(500ms, 30s, 10m...) [default: no limit].",
    ),
    no_listen: bool = typer.Option(False, "--no-listen", help="Poll only, no LISTEN/NOTIFY."),
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
) -> None:
    """Publish committed outbox rows to Kafka until SIGTERM (exit 0)."""
    configure_logging(log_level, json_lines=json_logs)
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
    if request_timeout_ms is not None:
        request_timeout = request_timeout_ms / 1000
    shortest_lease_s = 2 * request_timeout
    if lease_ttl < shortest_lease_s:
        raise typer.BadParameter(
            f"{lease_ttl:g}s is below {shortest_lease_s:g}s, twice --request-timeout "
            f"({request_timeout:g}s): a batch in flight must not outlive its lease",
            param_hint="--lease-ttl",
        )
    if stall_after < poll_interval:
        raise typer.BadParameter(
            f"{stall_after:g}s is below --poll-interval ({poll_interval:g}s): without LISTEN "
            "a row waits that long for a relay that is well",
            param_hint="--stall-after",
        )
    try:
        options = RelayOptions(
            batch_size=batch_size,
            lease_ttl_s=lease_ttl,
            poll_interval_s=poll_interval,
            max_attempts=max_attempts,
            retention_s=retention,
            request_timeout_s=request_timeout,
            max_request_size=max_request_size,
            listen=not no_listen,
            mode=mode,  # type: ignore[arg-type]  # checked by RelayOptions
            slot_name=slot,
            logical_reader=logical_reader,  # type: ignore[arg-type]  # checked by RelayOptions
            stall_after_s=stall_after,
            max_slot_lag_bytes=max_slot_lag_bytes,
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    if timeout is not None and not drain:
        raise CliError("--timeout: only with --drain")
    if (mode == "logical" or drop_slot) and not _logical_capable(settings.db_url):
        raise CliError("--mode logical needs PostgreSQL; SQLite relays poll (--mode poll)")
    if drain:  # a one-off run fails fast on a misconfigured database, not retrying
        asyncio.run(ping_database(settings.db_url))
    # An unmigrated database is one line before the relay starts (no started/stopped lines).
    asyncio.run(require_migrated(settings.db_url, strict=drain))
    if drain:  # ... and on an unreachable broker
        asyncio.run(ping_kafka(kafka, request_timeout))
    if mode == "logical" or drop_slot:
        # Refused at once, in one line, rather than by a relay retrying for ever.
        asyncio.run(logical_slot(settings.db_url, slot, drop=drop_slot, drain=drain))
        if drop_slot:
            return
    relay_process = Relay(db_url=settings.db_url, kafka=kafka, options=options)
    if metrics_port is not None:
        serve_metrics(metrics_port, metrics_address, relay_process.readiness)
    progress = ProgressReport("relay --drain: published", enabled=drain and not json_logs)
    total = asyncio.run(_pending_rows(settings.db_url)) if drain else None
    asyncio.run(_run(relay_process, drain, progress, total, timeout))


async def require_migrated(db_url: str, *, strict: bool) -> None:
    """Raise :class:`NotMigratedError` if the relay's tables are missing. An unreachable
    database raises only if ``strict``; else the relay starts and retries it with backoff."""
    engine = ops_engine(db_url, DEFAULT_TIMEOUT_S)
    try:
        async with asyncio.timeout(DEFAULT_TIMEOUT_S):
            await require_tables(engine, RELAY_TABLES)
    except (DBAPIError, OSError, TimeoutError):
        if strict:
            raise
    finally:
        await engine.dispose()


async def ping_kafka(kafka: KafkaSettings, timeout_s: float) -> None:
    """One metadata round trip to the broker; a one-line :class:`CliError` if it fails."""
    publisher = Publisher(
        kafka,
        request_timeout_s=timeout_s,
        linger_s=0.0,
        max_batch_bytes=1024,
        max_request_size=1024,
        client_id="outboxkit-relay-check",
    )
    try:
        async with asyncio.timeout(timeout_s + 5):
            await publisher.ping()
    except (KafkaUnavailable, TimeoutError) as error:
        raise CliError(f"kafka at {kafka.bootstrap} unreachable: {error or 'no answer'}") from None
    finally:
        await publisher.stop()


async def logical_slot(
    db_url: str, name: str | None, *, drop: bool = False, drain: bool = False
) -> None:
    """Check that logical mode can run on ``db_url`` (a one-line error if not); with ``drop``,
    drop the slot (refused while a relay reads it). With ``drain``, also what the stream
    needs now (:func:`~outboxkit.relay.slot.refusal`: a long-running relay waits for it).
    A database that does not answer is left to the relay, which retries (as in poll mode)."""
    if not _logical_capable(db_url):
        raise CliError("--mode logical needs PostgreSQL; SQLite relays poll (--mode poll)")
    engine = make_async_engine(db_url)
    try:
        try:
            await require_logical(engine)
        except OSError:
            if drop or drain:
                raise
            return  # down at start: the relay retries with backoff
        except DBAPIError as error:
            if drop or drain or not error.connection_invalidated:
                raise
            return
        if name is None:
            async with engine.connect() as conn:
                name = default_slot_name(str(await conn.scalar(text("SELECT current_database()"))))
        if drain:
            reason = await refusal(engine, name)
            if reason is not None:
                raise CliError(reason)
        if not drop:
            return
        try:
            dropped = await Slot(engine, name).drop()
        except DBAPIError as error:
            raise CliError(
                f"could not drop slot {name} (stop its relay first): {error.orig}"
            ) from error
        print(f"slot {name} {'dropped' if dropped else 'did not exist'}")
    finally:
        await engine.dispose()


async def _run(
    relay_process: Relay,
    drain: bool,
    progress: ProgressReport | None = None,
    total: int | None = None,
    timeout_s: float | None = None,
) -> None:
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
    # What start-up imported and built lives as long as the process: frozen out of the garbage
    # collector, so the full collections that streaming many events triggers do not walk it
    # again each time (a quarter of the logical relay's CPU before; bench/README.md, issue 14).
    gc.freeze()
    try:
        if signals.requested():
            return  # stopped while starting up: nothing began, nothing to finish
        if drain:
            try:
                await _drain(
                    relay_process, progress or ProgressReport("", enabled=False), total, timeout_s
                )
            except TimeoutError:
                raise CliError(
                    f"relay --drain: not drained within --timeout {timeout_s:g} s "
                    "(what is left is published by the next relay)"
                ) from None
        else:
            await relay_process.run()
        await asyncio.gather(*stopping)
    finally:
        for signum in signals.STOP_SIGNALS:
            loop.remove_signal_handler(signum)
        signals.hold_again()  # not the defaults while the loop and the interpreter wind down


async def _pending_rows(db_url: str) -> int | None:
    """Rows due now, for the drain's progress display only (``None`` if not read)."""
    engine = ops_engine(db_url, DEFAULT_TIMEOUT_S)
    try:
        async with asyncio.timeout(DEFAULT_TIMEOUT_S):
            return await count_rows(engine, which="pending")
    except (DBAPIError, OSError, TimeoutError):
        return None
    finally:
        await engine.dispose()


async def _drain(
    relay_process: Relay, progress: ProgressReport, total: int | None, timeout_s: float | None
) -> None:
    """Drain (within ``timeout_s``), showing rows published against the rows pending at the
    start (stderr)."""

    async def watch() -> None:
        while True:
            progress.update(relay_process.stats.published, total)
            await asyncio.sleep(PROGRESS_TICK_S)

    watcher = asyncio.create_task(watch())
    try:
        await relay_process.drain(timeout_s=timeout_s)
    finally:
        watcher.cancel()
        progress.update(relay_process.stats.published, total)
        progress.close()


async def _stop_quietly(relay_process: Relay) -> None:
    with contextlib.suppress(Exception):
        await relay_process.stop()


def _logical_capable(db_url: str) -> bool:
    """Whether ``db_url``'s database has logical decoding (a bad URL raises its one-line error)."""
    return dialect_of(parse_url(db_url)).logical_replication
