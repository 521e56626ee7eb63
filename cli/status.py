"""``outboxkit status``: the pipeline at a glance, by source, with alert thresholds as the exit
code; ``--watch`` redraws it in place.

Exit codes (the table of :mod:`outboxkit.cli.errors`): 0 every source read and no threshold
crossed; 1 a threshold crossed (each one named on stderr); 3 a source could not be read (each
one named on stderr; the sections of the other sources are printed as usual). 3 wins over 1:
a threshold on an unreachable source cannot be checked, and an unreachable broker or database
is usually the cause of the thresholds that are crossed. 2 is for usage errors only. A
``--watch`` ended with Ctrl-C exits 0: it has no end of its own, so that is its normal end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from outboxkit.cli.errors import EXIT_OK, EXIT_THRESHOLD, EXIT_UNREACHABLE, CliError
from outboxkit.cli.options import (
    BootstrapOption,
    DbUrlOption,
    Duration,
    JsonOption,
    SaslMechanismOption,
    SaslUsernameOption,
    SecurityProtocolOption,
    SslCafileOption,
    SslCertfileOption,
    SslKeyfileOption,
    TimeoutOption,
    duration_option,
    kafka_from,
    settings_from,
)
from outboxkit.ops.access import quiet_kafka_logs
from outboxkit.ops.formatting import format_age, ops_console, ranges
from outboxkit.ops.status import (
    DEFAULT_MAX_GROUP_STALL_S,
    DEFAULT_MAX_SLOT_INACTIVE_S,
    DEFAULT_MAX_STALL_S,
    DlqInfo,
    DlqTopicUnreachable,
    RelayInfo,
    StatusReport,
    Thresholds,
    Unreachable,
    read_status,
)
from outboxkit.outbox.sharding import SHARD_COUNT
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

DEFAULT_WATCH_S = 2.0
GroupsOption = typer.Option(
    None,
    "--group",
    help="Consumer group to report lag for (repeatable; default: every consumer in the inbox).",
)
DlqTopicsOption = typer.Option(
    None, "--dlq", help="Dead-letter topic to count (repeatable; default: every *.dlq topic)."
)


def status(
    seconds: float | None = typer.Argument(
        None,
        metavar="[INTERVAL]",
        parser=Duration(0.1),
        help=f"With --watch: time between refreshes (default {DEFAULT_WATCH_S:g}s; 2, 5s, 1m).",
    ),
    watch: bool = typer.Option(
        False, "--watch", help="Redraw the status in place every INTERVAL until Ctrl-C."
    ),
    groups: list[str] | None = GroupsOption,
    dlq_topics: list[str] | None = DlqTopicsOption,
    max_oldest_age: float | None = duration_option(
        None,
        "--max-oldest-age",
        minimum_s=0.0,
        help="Exit 1 if the oldest due, unpublished row has waited longer (60, 5m); rows "
        "scheduled for later do not count.",
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
    max_slot_lag_bytes: int | None = typer.Option(
        None,
        "--max-slot-lag-bytes",
        min=0,
        help="Exit 1 if a logical replication slot's confirmed position trails the WAL by more "
        "bytes (logical relay mode).",
    ),
    max_slot_age: float | None = duration_option(
        None,
        "--max-slot-age",
        minimum_s=0.0,
        help="Exit 1 if a slot's oldest unconfirmed outbox insert is older (60, 5m).",
    ),
    max_stall: float = duration_option(
        DEFAULT_MAX_STALL_S,
        "--max-stall",
        minimum_s=0.0,
        help="Exit 1 if a row has been due this long on a relay that published nothing for as "
        "long, or on shards no live relay holds.",
    ),
    max_slot_inactive: float = duration_option(
        DEFAULT_MAX_SLOT_INACTIVE_S,
        "--max-slot-inactive",
        minimum_s=0.0,
        help="Exit 1 if a slot nobody streams has an outbox insert unconfirmed this long, or "
        "is about to be invalidated (wal_status unreserved or lost).",
    ),
    max_group_stall: float = duration_option(
        DEFAULT_MAX_GROUP_STALL_S,
        "--max-group-stall",
        minimum_s=0.0,
        help="Exit 1 if a group's next record in a partition was written this long ago and "
        "the group has committed nothing there for as long.",
    ),
    as_json: bool = JsonOption,
    db_url: str | None = DbUrlOption,
    bootstrap: str | None = BootstrapOption,
    security_protocol: str | None = SecurityProtocolOption,
    sasl_mechanism: str | None = SaslMechanismOption,
    sasl_username: str | None = SaslUsernameOption,
    ssl_cafile: Path | None = SslCafileOption,
    ssl_certfile: Path | None = SslCertfileOption,
    ssl_keyfile: Path | None = SslKeyfileOption,
    timeout: float = TimeoutOption,
) -> int:
    """Outbox backlog, relays and shard leases, UNKNOWN actions, inbox, consumer lag, dead
    letters; each source (database, broker) reported on its own.

    Exit 0 all read and no threshold crossed, 1 a threshold crossed, 3 a source unreachable
    (wins over 1), 2 a usage error.
    """
    if seconds is not None and not watch:
        raise CliError(f"INTERVAL ({seconds:g}s) is the refresh interval of --watch: add --watch")
    if watch and as_json:
        raise CliError("--watch draws a live view for a terminal: use --json without --watch")
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
    limits = Thresholds(
        max_oldest_age,
        max_dlq,
        max_parked,
        max_lag,
        max_slot_lag_bytes,
        max_slot_age,
        max_stall,
        max_slot_inactive,
        max_group_stall,
    )
    quiet_kafka_logs()

    def read() -> Coroutine[Any, Any, StatusReport]:
        return read_status(
            settings.db_url,
            kafka,
            groups=groups or (),
            dlq_topics=dlq_topics or (),
            timeout=timeout,
            limits=limits,
        )

    if watch:
        return _watch(ops_console(), seconds or DEFAULT_WATCH_S, read)
    report = asyncio.run(read())
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        # Piped, a long cause stays on one line for grep and log collectors.
        ops_console().print(Group(*render(report)), soft_wrap=not sys.stdout.isatty())
    for line in report.crossed:
        typer.echo(f"outboxkit: threshold crossed: {line}", err=True)
    for line in report.unreachable():
        typer.echo(f"outboxkit: unreachable: {line}", err=True)
    return exit_code(report)


def exit_code(report: StatusReport) -> int:
    """3 if a source could not be read (whatever else), else 1 if a threshold was crossed."""
    if report.unreachable():
        return EXIT_UNREACHABLE
    return EXIT_THRESHOLD if report.crossed else EXIT_OK


def _watch(
    console: Console, interval: float, read: Callable[[], Coroutine[Any, Any, StatusReport]]
) -> int:
    async def redraw() -> None:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            live.update(Text("outboxkit status: reading the database and the broker..."))
            live.refresh()
            while True:
                report = await read()  # each source with its own timeout, every time
                live.update(Group(_watch_header(interval), *render(report), *_footer(report)))
                live.refresh()
                await asyncio.sleep(interval)

    # Ctrl-C is how a watch ends: the last picture stays on the screen.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(redraw())
    return EXIT_OK


def _watch_header(interval: float) -> Text:
    now = datetime.now().astimezone().strftime("%H:%M:%S")
    return Text(f"outboxkit status at {now}, every {interval:g} s (Ctrl-C to quit)")


def _footer(report: StatusReport) -> list[RenderableType]:
    lines = [f"threshold crossed: {line}" for line in report.crossed]
    lines += [f"unreachable: {line}" for line in report.unreachable()]
    return [Text(line) for line in lines]


def render(report: StatusReport) -> list[RenderableType]:
    """The report for people: the database's sections, then the broker's."""
    db = report.database
    if isinstance(db, Unreachable):
        parts: list[RenderableType] = [
            Text(f"{name}: unreachable: {db.cause}")
            for name in ("outbox", "relays", "actions", "inbox")
        ]
    else:
        outbox = db.outbox
        oldest = (
            f"oldest unpublished {_age(outbox.oldest_age_s)} old"
            if outbox.oldest_age_s is not None
            else "nothing unpublished"
        )
        line = f"outbox: backlog {outbox.backlog}, {oldest}, parked {outbox.parked_text}"
        if outbox.scheduled:
            next_due = _age(outbox.next_due_in_s)
            line += f", scheduled {outbox.scheduled_text}, next due in {next_due}"
        parts = [Text(line)]
        for slot in db.slots:
            age = slot.oldest_unconfirmed_age_s
            if slot.wal_status == "lost":
                stage = "INVALIDATED (wal_status lost)"
            elif slot.catch_up_published is not None:
                stage = f"catching up ({slot.catch_up_published} rows published)"
            else:
                stage = "streaming"
            parts.append(
                Text(
                    f"slot {slot.name}: {'active' if slot.active else 'idle'}, {stage}, lag "
                    f"{slot.lag_bytes} bytes, WAL kept {slot.retained_bytes} bytes, oldest "
                    f"unconfirmed insert {_age(age) + ' old' if age is not None else 'none'}"
                )
            )
        parts += [Text(f"WAL-message gap: {gap.line()}") for gap in db.gaps]
        parts.append(_relays(db.relays, SHARD_COUNT - db.free_shards))
        actions = db.actions
        if actions.unknown:
            parts.append(
                Text(
                    f"actions: {actions.unknown} UNKNOWN ({actions.needs_attention} flagged "
                    f"for a person), oldest UNKNOWN for {_age(actions.oldest_unknown_age_s)}"
                )
            )
        else:
            parts.append(Text("actions: none UNKNOWN"))
        blocked = db.sequences
        if blocked.blocked_keys:
            parts.append(
                Text(
                    f"sequences: {blocked.blocked_keys} key(s) blocked behind a dead letter, "
                    f"{blocked.held} record(s) held, oldest blocked for "
                    f"{_age(blocked.oldest_blocked_age_s)}"
                )
            )
        by_consumer = ", ".join(
            f"{name} {rows}, last {_age(db.inbox.last_processed_age_s.get(name))} ago"
            for name, rows in db.inbox.by_consumer.items()
        )
        parts.append(
            Text(f"inbox: {db.inbox.rows} row(s)" + (f" ({by_consumer})" if by_consumer else ""))
        )
    parts.append(_consumers(report))
    parts.extend(_dead_letters(report))
    return parts


def _age(seconds: float | None) -> str:
    return format_age(seconds * 1000 if seconds is not None else None)


def _relays(relays: list[RelayInfo], held: int) -> RenderableType:
    if not relays:
        return Text(f"relays: none registered ({held} of {SHARD_COUNT} shards leased)")
    table = Table(title=Text(f"relays: {held} of {SHARD_COUNT} shards leased"))
    for name in ("RELAY", "HOST", "PID", "HEARTBEAT", "QUIET", "SHARDS", "HELD"):
        table.add_column(name, justify="right" if name in ("PID", "SHARDS") else "left")
    for relay in relays:
        beat, quiet = relay.heartbeat_age_s, relay.quiet_s
        cells = (
            relay.relay_id,
            relay.host or "? (not registered)",
            relay.pid if relay.pid is not None else "-",
            f"{_age(beat)} ago" if beat is not None else "-",
            _age(quiet) if quiet is not None else "-",
            len(relay.shards),
            ranges(relay.shards),
        )
        table.add_row(*(Text(str(cell)) for cell in cells))
    return table


def _consumers(report: StatusReport) -> RenderableType:
    if isinstance(report.consumers, Unreachable):
        return Text(f"consumer lag: unreachable: {report.consumers.cause}")
    if not report.consumers:
        return Text("consumer lag: no groups")
    table = Table(title=Text("consumer lag"))
    for name in ("GROUP", "TOPIC", "P", "COMMITTED", "END", "LAG"):
        table.add_column(name, justify="left" if name in ("GROUP", "TOPIC") else "right")
    for group in report.consumers:
        if not group.partitions:
            table.add_row(Text(group.group), Text("(no committed offsets)"), *[Text("")] * 4)
        for part in group.partitions:
            committed = "-" if part.committed is None else str(part.committed)
            cells = (group.group, part.topic, part.partition, committed, part.end, part.lag)
            table.add_row(*(Text(str(cell)) for cell in cells))
    return table


def _dead_letters(report: StatusReport) -> list[RenderableType]:
    if isinstance(report.dlq, Unreachable):
        return [Text(f"dead letters: unreachable: {report.dlq.cause}")]
    read = [info for info in report.dlq if isinstance(info, DlqInfo)]
    parts: list[RenderableType] = []
    if read:
        table = Table(title=Text("dead letters"))
        for name in ("TOPIC", "RECORDS", "DISCARDED", "REPLAYED", "OLDEST"):
            table.add_column(name, justify="left" if name == "TOPIC" else "right")
        for info in read:
            replayed = "?" if info.replayed is None else str(info.replayed)
            discarded = "?" if info.discarded is None else str(info.discarded)
            oldest = f"{_age(info.oldest_age_s)} old" if info.oldest_age_s is not None else "-"
            cells = (info.topic, str(info.records), discarded, replayed, oldest)
            table.add_row(*(Text(cell) for cell in cells))
        parts.append(table)
    for missing in report.dlq:
        if isinstance(missing, DlqTopicUnreachable):
            parts.append(Text(f"dead letters in {missing.topic}: unreachable: {missing.cause}"))
    return parts or [Text("dead letters: no dead-letter topics")]
