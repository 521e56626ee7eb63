"""``outboxkit status``: the pipeline at a glance, with alert thresholds as the exit code.

Exit codes: 0 healthy (no threshold crossed), 1 a threshold crossed (each one named on
stderr), 2 the status could not be read (broker or database unreachable, bad option).
"""

from __future__ import annotations

import asyncio
import json

import typer
from outboxkit.cli.options import (
    BootstrapOption,
    DbUrlOption,
    JsonOption,
    TimeoutOption,
    settings_from,
)
from outboxkit.ops.access import database_bounded, ops_engine, quiet_kafka_logs, require_tables
from outboxkit.ops.dlq.reader import DlqReader
from outboxkit.ops.formatting import format_age, ops_console, ranges
from outboxkit.ops.status import (
    TABLES,
    StatusReport,
    Thresholds,
    crossed,
    database_status,
    dlq_counts,
    group_lags,
)
from outboxkit.outbox.sharding import SHARD_COUNT
from rich.console import Console
from rich.table import Table
from rich.text import Text

EXIT_CROSSED = 1
GroupsOption = typer.Option(
    None,
    "--group",
    help="Consumer group to report lag for (repeatable; default: every consumer in the inbox).",
)
DlqTopicsOption = typer.Option(
    None, "--dlq", help="Dead-letter topic to count (repeatable; default: every *.dlq topic)."
)


def status(
    groups: list[str] | None = GroupsOption,
    dlq_topics: list[str] | None = DlqTopicsOption,
    max_oldest_age: float | None = typer.Option(
        None, "--max-oldest-age", min=0, help="Exit 1 if the oldest unpublished row is older (s)."
    ),
    max_dlq: int | None = typer.Option(
        None, "--max-dlq", min=0, help="Exit 1 if a dead-letter topic holds more records."
    ),
    max_parked: int | None = typer.Option(
        None, "--max-parked", min=0, help="Exit 1 if more outbox rows are parked."
    ),
    max_lag: int | None = typer.Option(
        None, "--max-lag", min=0, help="Exit 1 if a consumer group lags more records in total."
    ),
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
    bootstrap: str | None = BootstrapOption,
    timeout: float = TimeoutOption,
) -> int:
    """Outbox backlog, relays and shard leases, consumer lag, inbox, dead letters."""
    settings = settings_from(db_url, bootstrap)
    limits = Thresholds(max_oldest_age, max_dlq, max_parked, max_lag)
    quiet_kafka_logs()

    async def collect() -> StatusReport:
        engine = ops_engine(settings.db_url, timeout)
        try:
            async with database_bounded(engine, timeout):
                await require_tables(engine, TABLES)
                database = await database_status(engine)
            async with DlqReader(settings.kafka_bootstrap, timeout) as reader:
                lags = await group_lags(reader, groups or list(database.inbox_by_consumer))
                dlq = await dlq_counts(reader, engine, dlq_topics)
            return StatusReport(database, lags, dlq)
        finally:
            await engine.dispose()

    report = asyncio.run(collect())
    report.crossed = crossed(report, limits)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print(ops_console(), report)
    for line in report.crossed:
        typer.echo(f"outboxkit: threshold crossed: {line}", err=True)
    return EXIT_CROSSED if report.crossed else 0


def _print(console: Console, report: StatusReport) -> None:
    db = report.database
    outbox = db.outbox
    oldest = (
        f"oldest unpublished {format_age(outbox.oldest_age_s * 1000)} old"
        if outbox.oldest_age_s is not None
        else "nothing unpublished"
    )
    console.print(f"outbox: backlog {outbox.backlog}, {oldest}, parked {outbox.parked}")
    held = SHARD_COUNT - db.free_shards
    relays = Table(title=Text(f"relays: {held} of {SHARD_COUNT} shards leased"))
    for name in ("RELAY", "HOST", "PID", "HEARTBEAT", "SHARDS", "HELD"):
        relays.add_column(name, justify="right" if name in ("PID", "SHARDS") else "left")
    for relay in db.relays:
        beat = relay.heartbeat_age_s
        relays.add_row(
            *(
                Text(str(cell))
                for cell in (
                    relay.relay_id,
                    relay.host or "? (not registered)",
                    relay.pid if relay.pid is not None else "-",
                    f"{format_age(beat * 1000)} ago" if beat is not None else "-",
                    len(relay.shards),
                    ranges(relay.shards),
                )
            )
        )
    console.print(relays if db.relays else "relays: none registered")
    lag = Table(title=Text("consumer lag"))
    for name in ("GROUP", "TOPIC", "P", "COMMITTED", "END", "LAG"):
        lag.add_column(name, justify="left" if name in ("GROUP", "TOPIC") else "right")
    for group in report.consumers:
        if not group.partitions:
            lag.add_row(Text(group.group), Text("(no committed offsets)"), *[Text("")] * 4)
        for part in group.partitions:
            committed = "-" if part.committed is None else str(part.committed)
            cells = (group.group, part.topic, part.partition, committed, part.end, part.lag)
            lag.add_row(*(Text(str(cell)) for cell in cells))
    console.print(lag if report.consumers else "consumer lag: no groups")
    by_consumer = ", ".join(f"{name} {rows}" for name, rows in db.inbox_by_consumer.items())
    console.print(f"inbox: {db.inbox_rows} row(s)" + (f" ({by_consumer})" if by_consumer else ""))
    dlq = Table(title=Text("dead letters"))
    for name in ("TOPIC", "RECORDS", "REPLAYED"):
        dlq.add_column(name, justify="left" if name == "TOPIC" else "right")
    for info in report.dlq:
        dlq.add_row(Text(info.topic), Text(str(info.records)), Text(str(info.replayed)))
    console.print(dlq if report.dlq else "dead letters: no dead-letter topics")
