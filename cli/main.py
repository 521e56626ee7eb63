"""The ``outboxkit`` command line: the root app composes one sub-app or command per concern.

Nothing imports this module; it imports the command modules. Errors an operator can fix end in
one line on stderr and exit code 2 (the table is in :mod:`outboxkit.cli.errors`).
"""

from __future__ import annotations

import sys
import traceback

import typer
from outboxkit.cli.actions import actions_app
from outboxkit.cli.consume import consume
from outboxkit.cli.dev import dev_app
from outboxkit.cli.dlq import dlq_app
from outboxkit.cli.errors import EXIT_BUG, EXIT_INTERRUPTED, EXIT_USAGE, error_line
from outboxkit.cli.idempotency import idempotency_app
from outboxkit.cli.migrate import migrate
from outboxkit.cli.outbox import outbox_app
from outboxkit.cli.relay import relay
from outboxkit.cli.status import status

app = typer.Typer(
    name="outboxkit",
    help="Transactional outbox, Kafka relay, inbox consumers and agent actions.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
)
app.command()(migrate)
app.command()(relay)
app.command()(consume)
app.command()(status)
app.add_typer(outbox_app, name="outbox")
app.add_typer(dlq_app, name="dlq")
app.add_typer(actions_app, name="actions")
app.add_typer(idempotency_app, name="idempotency")
app.add_typer(dev_app, name="dev")


def main(argv: list[str] | None = None) -> None:
    """Run the CLI and exit with a code from the table in :mod:`outboxkit.cli.errors`."""
    try:
        result = app(args=argv, standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(EXIT_INTERRUPTED)
    except Exception as error:
        message = error_line(error)
        if message is None:
            traceback.print_exc()
            sys.exit(EXIT_BUG)
        print(f"outboxkit: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if isinstance(result, int):
        sys.exit(result)
