"""One example per command, shown at the end of its ``--help`` (click's epilog).

Kept in one table so a test can check that every command has one and that each example
parses with the real command line (tests/cli/test_conventions.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

EXAMPLES: dict[str, str] = {
    "migrate": "outboxkit migrate --db-url postgresql://app@db/orders",
    "relay": "outboxkit relay --db-url postgresql://app@db/orders --bootstrap kafka:9092 "
    "--poll-interval 500ms",
    "consume": "outboxkit consume billing.consumers:app --group billing --log-level INFO",
    "status": "outboxkit status --max-oldest-age 5m --max-dlq 0 --json",
    "outbox list": "outboxkit outbox list --parked --limit 20",
    "outbox requeue": "outboxkit outbox requeue --all-parked --json",
    "outbox gaps": "outboxkit outbox gaps --ack 1",
    "dlq list": "outboxkit dlq list orders.dlq --group --since 2h",
    "dlq show": "outboxkit dlq show orders.dlq 42 --partition 0",
    "dlq replay": "outboxkit dlq replay orders.dlq --error-class TimeoutError --dry-run",
    "dlq discard": "outboxkit dlq discard orders.dlq --error-class TimeoutError "
    "--reason 're-entered by hand' --dry-run",
    "dlq undiscard": "outboxkit dlq undiscard orders.dlq --partition 0 --from-offset 4 "
    "--to-offset 4 --reason 'replay it after all'",
    "dlq sequences list": "outboxkit dlq sequences list --consumer billing --json",
    "dlq sequences show": "outboxkit dlq sequences show --consumer billing --topic orders "
    "--key order-7",
    "dlq sequences skip": "outboxkit dlq sequences skip --consumer billing --topic orders "
    "--key order-7 --reason 'duplicate of order-6' --by alice",
    "dlq sequences release": "outboxkit dlq sequences release --consumer billing --topic orders "
    "--key order-7 --reason 'fixed by hand in the ERP' --by alice",
    "console": "outboxkit console --db-url postgresql://app@db/orders --bootstrap kafka:9092 "
    "--tokens-file /etc/outboxkit/console-tokens",
    "actions list": "outboxkit actions list --state UNKNOWN --older-than 10m",
    "actions show": "outboxkit actions show refund-42 --tenant acme",
    "actions resolve": "outboxkit actions resolve refund-42 --tenant acme --succeeded "
    "--by alice --reason 'seen in the provider dashboard' --json",
    "actions approvals": "outboxkit actions approvals --tenant acme --json",
    "actions sweep": "outboxkit actions sweep --limit 1000 --json",
    "actions cleanup": "outboxkit actions cleanup --chunk-size 500",
    "idempotency purge": "outboxkit idempotency purge --chunk-size 1000",
    "dev kafka": "outboxkit dev kafka --port 9092",
    "workflows list": "outboxkit workflows list --stuck-after 10m",
    "workflows show": "outboxkit workflows show acme po-17",
    "workflows cancel": "outboxkit workflows cancel acme po-17 --by alice --reason duplicate "
    "--app purchasing.workflows:engine",
    "workflows resume": "outboxkit workflows resume acme po-17 --by alice --reason refunded "
    "--app purchasing.workflows:engine",
    "workflows escalate": "outboxkit workflows escalate acme po-17 --by alice --reason stuck "
    "--app purchasing.workflows:engine",
    "workflows run": "outboxkit workflows run purchasing.workflows:engine --poll-interval 1s",
}


def add_examples(app: typer.Typer, prefix: str = "") -> None:
    """Give each command of ``app`` (and of its sub-apps) its example as the help's epilog."""
    for command in app.registered_commands:
        name = command.name or (command.callback.__name__ if command.callback else "")
        example = EXAMPLES.get(f"{prefix}{name.replace('_', '-')}")
        if example is not None and command.epilog is None:
            command.epilog = f"\b\nExample:\n  {example}"
    for group in app.registered_groups:
        if group.typer_instance is not None:
            add_examples(group.typer_instance, f"{prefix}{group.name} ")
