"""``outboxkit dlq``: list, group, show, replay and discard dead-letter records.

``show`` prints a record's payload on purpose
(it is an inspection tool); nothing here logs one.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from outboxkit.cli.dlq_sequences import sequences_app
from outboxkit.cli.errors import CliError
from outboxkit.cli.options import (
    BootstrapOption,
    DbUrlOption,
    JsonOption,
    SaslMechanismOption,
    SaslUsernameOption,
    SecurityProtocolOption,
    SslCafileOption,
    SslCertfileOption,
    SslKeyfileOption,
    TimeoutOption,
    kafka_from,
    parse_time,
    settings_from,
)
from outboxkit.consumers.dlq_headers import header_texts
from outboxkit.ops.access import database_bounded, ops_engine, quiet_kafka_logs, require_tables
from outboxkit.ops.dlq.discard import (
    DiscardOptions,
    DiscardSummary,
    Key,
    discard,
    discarded_keys,
    visible,
)
from outboxkit.ops.dlq.grouping import FailureGroup, FailureGroups
from outboxkit.ops.dlq.reader import DlqFilter, DlqReader, DlqRecord
from outboxkit.ops.dlq.rendering import header_value, int_or_none, render_data, shown_header
from outboxkit.ops.dlq.replay import Replayer, ReplayOptions, ReplaySummary, Truncated
from outboxkit.ops.dlq.tables import dlq_discards, dlq_replays
from outboxkit.ops.formatting import format_ms, ops_console, os_user
from outboxkit.outbox.kafka_settings import KafkaSettings
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

dlq_app = typer.Typer(
    help="Dead-letter topics: list, group, show, replay and discard records.",
    no_args_is_help=True,
)

T = TypeVar("T")
PROGRESS_MIN_RECORDS = 100
TopicArgument = Annotated[str, typer.Argument(help="The dead-letter topic, e.g. orders.dlq.")]

# The filter options of `dlq list` and `dlq replay`, declared once; None means "no condition".
TypesOption = Annotated[
    list[str] | None, typer.Option("--type", help="CloudEvents type (repeatable: any of them).")
]
SourcesOption = Annotated[
    list[str] | None, typer.Option("--source", help="CloudEvents source (repeatable).")
]
ErrorClassesOption = Annotated[
    list[str] | None,
    typer.Option(
        "--error-class",
        help="permanent:ValidationError, ValidationError, or a category: permanent, exhausted.",
    ),
]
SinceOption = Annotated[
    str | None,
    typer.Option(
        "--since", help="Dead-lettered at or after: ISO-8601 or an age (90s, 15m, 2h, 7d)."
    ),
]
UntilOption = Annotated[
    str | None, typer.Option("--until", help="Dead-lettered at or before (as --since).")
]
FromOffsetOption = Annotated[
    int | None, typer.Option("--from-offset", min=0, help="First offset (inclusive).")
]
ToOffsetOption = Annotated[
    int | None, typer.Option("--to-offset", min=0, help="Last offset (inclusive).")
]
PartitionsOption = Annotated[
    list[int] | None, typer.Option("--partition", min=0, help="Only this partition (repeatable).")
]


@dataclass(frozen=True)
class _Connection:
    kafka: KafkaSettings
    timeout: float


def _filter(
    types: list[str] | None,
    sources: list[str] | None,
    error_classes: list[str] | None,
    since: str | None,
    until: str | None,
    from_offset: int | None,
    to_offset: int | None,
    partitions: list[int] | None,
) -> DlqFilter:
    now_ms = time.time_ns() // 1_000_000
    return DlqFilter(
        types=frozenset(types or ()),
        sources=frozenset(sources or ()),
        error_classes=frozenset(error_classes or ()),
        since_ms=parse_time(since, now_ms, "--since") if since is not None else None,
        until_ms=parse_time(until, now_ms, "--until") if until is not None else None,
        from_offset=from_offset,
        to_offset=to_offset,
        partitions=frozenset(partitions) if partitions else None,
    )


def _run(connection: _Connection, work: Callable[[DlqReader], Awaitable[T]]) -> T:
    quiet_kafka_logs()

    async def main() -> T:
        async with DlqReader(connection.kafka, connection.timeout) as reader:
            return await work(reader)

    return asyncio.run(main())


def _cell(value: object) -> Text:
    return Text("-" if value is None else str(value))


@dlq_app.command("list")
def list_command(
    topic: TopicArgument,
    types: TypesOption = None,
    sources: SourcesOption = None,
    error_classes: ErrorClassesOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    from_offset: FromOffsetOption = None,
    to_offset: ToOffsetOption = None,
    partitions: PartitionsOption = None,
    group: bool = typer.Option(
        False, "--group", help="Count failures per cause (error class and message pattern)."
    ),
    limit: int = typer.Option(1000, "--limit", min=1, help="Records listed at most."),
    include_discarded: bool = typer.Option(
        False, "--include-discarded", help="List discarded letters too (marked)."
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
) -> None:
    """List dead-letter records, or with --group count them per failure cause.

    With a database (--db-url, OUTBOXKIT_DB_URL or the config file), discarded letters are left
    out unless --include-discarded; without one, discards are not known and every letter is
    listed."""
    wanted = _filter(
        types, sources, error_classes, since, until, from_offset, to_offset, partitions
    )
    settings = settings_from(db_url)
    checked = "db_url" in settings.model_fields_set

    async def collect(reader: DlqReader) -> tuple[int, list[DlqRecord], FailureGroups, set[Key]]:
        discarded = await _discards(settings.db_url, topic, timeout) if checked else set()
        matched, shown, groups = 0, list[DlqRecord](), FailureGroups()
        records = reader.read(topic, wanted)
        async for record in records if include_discarded else visible(records, discarded):
            matched += 1
            if group:
                groups.add(record)
            elif len(shown) < limit:
                shown.append(record)
        return matched, shown, groups, discarded

    matched, shown, groups, discarded = _run(
        _Connection(
            kafka_from(
                bootstrap,
                security_protocol,
                sasl_mechanism,
                sasl_username,
                ssl_cafile,
                ssl_certfile,
                ssl_keyfile,
            ),
            timeout,
        ),
        collect,
    )
    ordered = groups.ordered()
    marked = discarded if include_discarded else set()
    if as_json:
        document: dict[str, Any] = {"topic": topic, "matched": matched}
        document["discards_checked"] = checked
        if group:
            document["groups"] = [g.to_json() for g in ordered]
        else:
            document["shown"] = len(shown)
            document["records"] = [
                {**record.to_json(), "discarded": (record.partition, record.offset) in marked}
                for record in shown
            ]
        typer.echo(json.dumps(document, indent=2))
        return
    console = ops_console()
    if group:
        _print_groups(console, topic, matched, ordered)
    else:
        _print_records(console, topic, matched, shown, marked)
    if checked and not include_discarded and discarded:
        console.print(
            f"the topic has {len(discarded)} discarded letter(s), not listed (--include-discarded)"
        )


async def _discards(db_url: str, topic: str, timeout: float) -> set[Key]:
    """The discarded letters of ``topic``, read from ``db_url``."""
    engine = ops_engine(db_url, timeout)
    try:
        async with database_bounded(engine, timeout):
            await require_tables(engine, [dlq_discards.name])
            return await discarded_keys(engine, topic)
    finally:
        await engine.dispose()


def _print_records(
    console: Console, topic: str, matched: int, shown: list[DlqRecord], marked: set[Key]
) -> None:
    if not matched:
        console.print(f"{topic}: no matching dead-letter records")
        return
    table = Table(title=Text(f"{topic}: {matched} matching dead-letter record(s)"))
    for name in ("P", "OFFSET", "TIME", "TYPE", "SOURCE", "ID", "ERROR CLASS", "ATTEMPTS"):
        table.add_column(name, justify="right" if name in ("P", "OFFSET", "ATTEMPTS") else "left")
    if marked:
        table.add_column("DISCARDED")
    for record in shown:
        flag = ["yes" if (record.partition, record.offset) in marked else ""] if marked else []
        table.add_row(
            *map(
                _cell,
                (
                    record.partition,
                    record.offset,
                    format_ms(record.timestamp),
                    record.type,
                    record.source,
                    record.id,
                    record.letter.error_class,
                    record.letter.attempts,
                    *flag,
                ),
            )
        )
    console.print(table)
    if len(shown) < matched:
        console.print(f"showing the first {len(shown)} of {matched} (--limit)")


def _print_groups(console: Console, topic: str, matched: int, groups: list[FailureGroup]) -> None:
    if not matched:
        console.print(f"{topic}: no matching dead-letter records")
        return
    table = Table(title=Text(f"{topic}: {matched} record(s), {len(groups)} cause(s)"))
    for name in ("COUNT", "ERROR CLASS", "MESSAGE PATTERN", "FIRST", "LAST", "EXAMPLE", "ID"):
        table.add_column(name, justify="right" if name == "COUNT" else "left")
    for entry in groups:
        table.add_row(
            *map(
                _cell,
                (
                    entry.count,
                    entry.error_class,
                    entry.pattern,
                    format_ms(entry.first_ms),
                    format_ms(entry.last_ms),
                    f"{entry.example.partition}@{entry.example.offset}",
                    entry.fingerprint,
                ),
            )
        )
    console.print(table)


@dlq_app.command("show")
def show_command(
    topic: TopicArgument,
    offset: int = typer.Argument(..., min=0, help="The record's offset."),
    partition: int = typer.Option(0, "--partition", min=0, help="The record's partition."),
    max_bytes: int = typer.Option(
        4096, "--max-bytes", min=16, help="Show at most this many bytes of the data."
    ),
    as_json: bool = JsonOption,
    bootstrap: str | None = BootstrapOption,
    security_protocol: str | None = SecurityProtocolOption,
    sasl_mechanism: str | None = SaslMechanismOption,
    sasl_username: str | None = SaslUsernameOption,
    ssl_cafile: Path | None = SslCafileOption,
    ssl_certfile: Path | None = SslCertfileOption,
    ssl_keyfile: Path | None = SslKeyfileOption,
    timeout: float = TimeoutOption,
) -> None:
    """Show one dead-letter record: headers decoded, data pretty-printed (capped)."""
    record = _run(
        _Connection(
            kafka_from(
                bootstrap,
                security_protocol,
                sasl_mechanism,
                sasl_username,
                ssl_cafile,
                ssl_certfile,
                ssl_keyfile,
            ),
            timeout,
        ),
        lambda reader: reader.fetch(topic, partition, offset),
    )
    letter = record.letter
    content_type = header_texts(letter.headers).get("content-type")
    data, truncated = render_data(letter.value, content_type, max_bytes)
    size = len(letter.value or b"")
    if as_json:
        document = {
            **record.to_json(),
            "headers": [{"name": n, "value": shown_header(n, v)} for n, v in letter.headers],
            "key": header_value(letter.key),
            "content_type": content_type,
            "data": data,
            "data_truncated": truncated,
        }
        typer.echo(json.dumps(document, indent=2, ensure_ascii=False))
        return
    typer.echo(f"{topic}[{record.partition}]@{record.offset}  {format_ms(record.timestamp)}")
    typer.echo(f"error: {letter.error_class or '-'}: {letter.error_message or '-'}")
    typer.echo("headers:")
    for name, value in letter.headers:
        text = shown_header(name, value)
        if name.startswith("outboxkit-") and (name.endswith("-ms") or name.endswith("timestamp")):
            text = f"{text} ({format_ms(int_or_none(value))})"
        typer.echo(f"  {name}: {text}")
    typer.echo(f"key: {'(none)' if letter.key is None else header_value(letter.key)}")
    typer.echo(f"data ({size} bytes, {content_type or 'no content-type'}):")
    typer.echo(data)
    if truncated:
        typer.echo(f"... truncated: {max_bytes} of the rendering shown (--max-bytes)")


@dlq_app.command("replay")
def replay_command(
    topic: TopicArgument,
    types: TypesOption = None,
    sources: SourcesOption = None,
    error_classes: ErrorClassesOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    from_offset: FromOffsetOption = None,
    to_offset: ToOffsetOption = None,
    partitions: PartitionsOption = None,
    to: str | None = typer.Option(
        None, "--to", help="Replay to this topic instead of each record's original topic."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would go; publish nothing."),
    rate: float | None = typer.Option(None, "--rate", help="At most this many records per second."),
    force: bool = typer.Option(False, "--force", help="Republish records replayed before."),
    by: str | None = typer.Option(None, "--by", help="Who replays (default: the OS user)."),
    fetch_original: bool = typer.Option(
        False,
        "--fetch-original",
        help="Replay a truncated letter's original record, read from its source topic.",
    ),
    allow_truncated: bool = typer.Option(
        False,
        "--allow-truncated",
        help="Replay a truncated letter as it is, under a new id, marked truncated.",
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
) -> None:
    """Republish the original records (key, value, CloudEvents headers) once each."""
    wanted = _filter(
        types, sources, error_classes, since, until, from_offset, to_offset, partitions
    )
    if fetch_original and allow_truncated:
        raise CliError("give --fetch-original or --allow-truncated, not both")
    truncated: Truncated = (
        "original" if fetch_original else "allow" if allow_truncated else "refuse"
    )
    options = ReplayOptions(
        by=by or os_user(), target=to, dry_run=dry_run, rate=rate, force=force, truncated=truncated
    )
    settings = settings_from(db_url)
    connection = _Connection(
        kafka_from(
            bootstrap,
            security_protocol,
            sasl_mechanism,
            sasl_username,
            ssl_cafile,
            ssl_certfile,
            ssl_keyfile,
        ),
        timeout,
    )
    engine = ops_engine(settings.db_url, timeout)
    progress = _progress(as_json)

    async def replay(reader: DlqReader) -> ReplaySummary:
        try:
            async with database_bounded(engine, timeout):
                await require_tables(engine, [dlq_replays.name, dlq_discards.name])
                replayer = Replayer(reader, engine)
                with progress:
                    return await replayer.run(topic, wanted, options, progress.update)
        finally:
            await engine.dispose()

    summary = _run(connection, replay)
    if as_json:
        typer.echo(json.dumps(summary.to_json(), indent=2))
    else:
        _print_summary(ops_console(), summary)
    if summary.target_missing:
        missing = ", ".join(sorted(summary.target_missing))
        raise CliError(
            f"{sum(summary.target_missing.values())} record(s) not replayed: topic(s) {missing} "
            "do not exist (choose one with --to)"
        )


class _ReplayProgress:
    """A rich progress bar on stderr for long replays in a terminal; silent otherwise."""

    def __init__(self, enabled: bool) -> None:
        self._progress = (
            Progress(
                TextColumn("replaying"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[replayed]} replayed"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            if enabled
            else None
        )
        self._task: Any = None

    def __enter__(self) -> _ReplayProgress:
        return self

    def __exit__(self, *_: object) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.stop()

    def update(self, covered: int, total: int, replayed: int) -> None:
        if self._progress is None or total < PROGRESS_MIN_RECORDS:
            return
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task("replay", total=total, replayed=0)
        self._progress.update(self._task, completed=covered, replayed=replayed)


def _progress(as_json: bool) -> _ReplayProgress:
    return _ReplayProgress(enabled=not as_json and sys.stderr.isatty())


def _print_summary(console: Console, summary: ReplaySummary) -> None:
    if summary.dry_run and summary.items:
        table = Table(title=Text(f"dry run: {summary.dlq_topic}"))
        for name in ("P", "OFFSET", "TYPE", "ID", "TARGET", "STATUS"):
            table.add_column(name, justify="right" if name in ("P", "OFFSET") else "left")
        for item in summary.items:
            table.add_row(
                *map(
                    _cell,
                    (item.partition, item.offset, item.type, item.id, item.target, item.status),
                )
            )
        console.print(table)
        if summary.more_items:
            console.print(f"... and {summary.more_items} more")
    verb = "would be replayed" if summary.dry_run else "replayed"
    console.print(
        f"{'dry run' if summary.dry_run else f'replay {summary.replay_id}'} by {summary.by}: "
        f"{summary.matched} matched, {summary.replayed} {verb}, "
        f"{summary.already_replayed} skipped as already replayed, "
        f"{summary.discarded} skipped as discarded, "
        f"{summary.no_target} without an original topic"
    )
    for target, count in sorted(summary.by_target.items()):
        console.print(f"  -> {target}: {count}")
    if summary.dry_run:
        console.print("nothing was published (--dry-run)")
    elif summary.already_replayed:
        console.print("records replayed before were skipped; --force republishes them")


ReasonOption = Annotated[
    str, typer.Option("--reason", help="Why (required; kept with each letter).")
]


def _discard_command(undo: bool) -> Callable[..., None]:
    """The ``dlq discard`` command, or with ``undo`` ``dlq undiscard`` (the same options)."""

    def command(
        topic: TopicArgument,
        reason: ReasonOption,
        types: TypesOption = None,
        sources: SourcesOption = None,
        error_classes: ErrorClassesOption = None,
        since: SinceOption = None,
        until: UntilOption = None,
        from_offset: FromOffsetOption = None,
        to_offset: ToOffsetOption = None,
        partitions: PartitionsOption = None,
        dry_run: bool = typer.Option(
            False, "--dry-run", help="Count the letters it would change; change nothing."
        ),
        by: str | None = typer.Option(None, "--by", help="Who (default: the OS user)."),
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
    ) -> None:
        _discard(
            topic,
            _filter(
                types, sources, error_classes, since, until, from_offset, to_offset, partitions
            ),
            DiscardOptions(by=by or os_user(), reason=reason, dry_run=dry_run, undo=undo),
            as_json,
            db_url,
            kafka_from(
                bootstrap,
                security_protocol,
                sasl_mechanism,
                sasl_username,
                ssl_cafile,
                ssl_certfile,
                ssl_keyfile,
            ),
            timeout,
        )

    command.__doc__ = (
        "Bring discarded letters back: listed and replayable again."
        if undo
        else "Set matching letters aside with a reason: no longer listed or replayed, still in "
        "Kafka (dlq show reads them; dlq list --include-discarded lists them)."
    )
    return command


dlq_app.command("discard")(_discard_command(undo=False))
dlq_app.command("undiscard")(_discard_command(undo=True))


def _discard(
    topic: str,
    wanted: DlqFilter,
    options: DiscardOptions,
    as_json: bool,
    db_url: str | None,
    kafka: KafkaSettings,
    timeout: float,
) -> None:
    engine = ops_engine(settings_from(db_url).db_url, timeout)

    async def work(reader: DlqReader) -> DiscardSummary:
        try:
            async with database_bounded(engine, timeout):
                await require_tables(engine, [dlq_discards.name])
                return await discard(reader, engine, topic, wanted, options)
        finally:
            await engine.dispose()

    summary = _run(_Connection(kafka, timeout), work)
    if as_json:
        typer.echo(json.dumps(summary.to_json(), indent=2))
        return
    console = ops_console()
    verb = "restore" if summary.undo else "discard"
    done = f"would {verb}" if summary.dry_run else ("restored" if summary.undo else "discarded")
    same = "not discarded" if summary.undo else "already discarded"
    head = "dry run" if summary.dry_run else f"{verb} {summary.discard_id}"
    console.print(
        f"{head} by {summary.by}: {summary.matched} matched, {summary.changed} {done}, "
        f"{summary.unchanged} {same}"
    )
    if summary.dry_run:
        console.print("nothing was changed (--dry-run)")


dlq_app.add_typer(sequences_app, name="sequences")
