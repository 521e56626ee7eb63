"""``outboxkit dlq sequences``: keys that wait behind a dead-lettered head (sequence mode).

``list`` and ``show`` read the blocked keys of consumers whose handlers use
``on_dead_letter="sequence"``; ``skip`` and ``release`` resolve a head without replaying it,
after which the consumer applies the held records in order. Replaying the head
(``outboxkit dlq replay``) resolves it too, once the consumer applies it.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from outboxkit.cli.options import DbUrlOption, JsonOption
from outboxkit.cli.sessions import in_session
from outboxkit.ops.dlq.sequences import (
    BlockedKey,
    Resolution,
    list_blocked_keys,
    resolve_head,
    show_blocked_key,
)
from outboxkit.ops.formatting import format_ms, ops_console, os_user
from rich.table import Table

sequences_app = typer.Typer(
    help="Keys held behind a dead-lettered head (on_dead_letter='sequence').",
    no_args_is_help=True,
)

ConsumerOption = Annotated[str, typer.Option("--consumer", help="The consumer (app) name.")]
TopicOption = Annotated[str, typer.Option("--topic", help="The key's topic.")]
KeyOption = Annotated[str, typer.Option("--key", help="The Kafka key, as text.")]
ReasonOption = Annotated[str, typer.Option("--reason", help="Why (kept with the key's record).")]
ByOption = Annotated[str | None, typer.Option("--by", help="Who (default: the OS user).")]


def _as_dict(blocked: BlockedKey) -> dict[str, object]:
    return {
        "consumer": blocked.consumer,
        "topic": blocked.topic,
        "key": blocked.key,
        "partition": blocked.partition,
        "state": blocked.state,
        "held": blocked.held,
        "head": {
            "source": blocked.head_source,
            "id": blocked.head_event_id,
            "offset": blocked.head_offset,
            "error_class": blocked.head_error,
        },
        "blocked_ms": blocked.blocked_ms,
        "resolution": blocked.resolution,
        "resolved_by": blocked.resolved_by,
        "reason": blocked.reason,
    }


@sequences_app.command("list")
def list_command(
    consumer: Annotated[str | None, typer.Option("--consumer", help="Only this consumer.")] = None,
    db_url: str | None = DbUrlOption,
    as_json: bool = JsonOption,
) -> None:
    """List blocked keys, oldest first, with the records held behind each.

    Example: outboxkit dlq sequences list --consumer billing
    """
    keys = in_session(db_url, lambda session: list_blocked_keys(session, consumer))
    if as_json:
        typer.echo(json.dumps({"keys": [_as_dict(k) for k in keys]}, indent=2))
        return
    console = ops_console()
    if not keys:
        console.print("no blocked keys")
        return
    table = Table("consumer", "topic", "key", "state", "held", "head error", "blocked since")
    for k in keys:
        table.add_row(
            k.consumer,
            k.topic,
            k.key,
            k.state,
            str(k.held),
            k.head_error or "-",
            format_ms(k.blocked_ms),
        )
    console.print(table)


@sequences_app.command("show")
def show_command(
    consumer: ConsumerOption,
    topic: TopicOption,
    key: KeyOption,
    db_url: str | None = DbUrlOption,
    as_json: bool = JsonOption,
) -> None:
    """Show one blocked key: its head and the first held records (never a payload).

    Example: outboxkit dlq sequences show --consumer billing --topic orders --key order-7
    """
    blocked, held = in_session(
        db_url, lambda session: show_blocked_key(session, consumer, topic, key)
    )
    if as_json:
        typer.echo(
            json.dumps(
                {
                    **_as_dict(blocked),
                    "held_records": [
                        {
                            "offset": h.offset,
                            "source": h.source,
                            "id": h.event_id,
                            "type": h.event_type,
                        }
                        for h in held
                    ],
                },
                indent=2,
            )
        )
        return
    console = ops_console()
    since = format_ms(blocked.blocked_ms)
    console.print(
        f"{blocked.consumer} {blocked.topic} key {blocked.key}: {blocked.state}, "
        f"{blocked.held} held since {since}"
    )
    offset = "-" if blocked.head_offset is None else str(blocked.head_offset)
    console.print(
        f"head: {blocked.head_source or '-'} {blocked.head_event_id or '-'} @{offset} "
        f"({blocked.head_error or '-'})"
    )
    table = Table("offset", "type", "source", "id")
    for h in held:
        table.add_row(str(h.offset), h.event_type or "-", h.source or "-", h.event_id or "-")
    console.print(table)


def _resolve(
    resolution: Resolution,
    consumer: str,
    topic: str,
    key: str,
    reason: str,
    by: str | None,
    db_url: str | None,
    as_json: bool,
) -> None:
    blocked = in_session(
        db_url,
        lambda session: resolve_head(
            session, consumer, topic, key, resolution=resolution, by=by or os_user(), reason=reason
        ),
    )
    if as_json:
        typer.echo(
            json.dumps(
                {"resolution": resolution, "released": 1, "held": blocked.held, "key": blocked.key}
            )
        )
    else:
        typer.echo(
            f"{resolution} the head of key {blocked.key}: {blocked.held} held record(s) to apply"
        )


@sequences_app.command("skip")
def skip_command(
    consumer: ConsumerOption,
    topic: TopicOption,
    key: KeyOption,
    reason: ReasonOption,
    by: ByOption = None,
    db_url: str | None = DbUrlOption,
    as_json: bool = JsonOption,
) -> None:
    """Give up the head for good; the held records are then applied in order.

    Example: outboxkit dlq sequences skip --consumer billing --topic orders --key order-7
    --reason "duplicate of order-6"
    """
    _resolve("skipped", consumer, topic, key, reason, by, db_url, as_json)


@sequences_app.command("release")
def release_command(
    consumer: ConsumerOption,
    topic: TopicOption,
    key: KeyOption,
    reason: ReasonOption,
    by: ByOption = None,
    db_url: str | None = DbUrlOption,
    as_json: bool = JsonOption,
) -> None:
    """Release the held records: the head was dealt with by other means.

    Example: outboxkit dlq sequences release --consumer billing --topic orders --key order-7
    --reason "fixed by hand in the ERP"
    """
    _resolve("released", consumer, topic, key, reason, by, db_url, as_json)
