"""The ``outboxkit`` command line: one app, one subcommand group per concern.

Errors an operator can fix (bad arguments, unreachable database or broker) end in one line on
stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys

import typer
from aiokafka.errors import KafkaError
from sqlalchemy.exc import DBAPIError

from outbox.errors import OutboxError

app = typer.Typer(
    name="outboxkit",
    help="Transactional outbox, Kafka relay, inbox consumers and agent actions.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
)
dev_app = typer.Typer(help="Development helpers.", no_args_is_help=True)
app.add_typer(dev_app, name="dev")

EXIT_USAGE = 2


class CliError(Exception):
    """An error reported to the operator as one line with exit code 2."""


# Each concern keeps its commands in its own module; importing one registers them on `app`.
COMMAND_MODULES = (
    "outbox.cli_commands",
    "relay.cli",
    "consumers.cli",
    "outbox.actions.cli",
    "consumers.dlq_cli",
    "outbox.admin_cli",
    "outbox.status_cli",
)


def _register_commands() -> None:
    for module in COMMAND_MODULES:
        importlib.import_module(module)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; usage and operational errors become one line and exit code 2."""
    _register_commands()
    try:
        result = app(args=argv, standalone_mode=False)
    except typer.Abort:
        sys.exit(130)
    except Exception as error:
        message = error_line(error)
        if message is None:
            raise
        print(f"outboxkit: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if isinstance(result, int):
        sys.exit(result)


def error_line(error: Exception) -> str | None:
    """The one line an operator sees for an expected error, or ``None`` for a bug."""
    if isinstance(error, typer.TyperException) and hasattr(error, "format_message"):
        return error.format_message()  # click's usage errors, as vendored by typer
    if isinstance(error, CliError | OutboxError):
        return str(error)
    if isinstance(error, DBAPIError):
        reason = str(error.orig or error).strip().splitlines()[0]
        return f"database unreachable or refused the request: {reason}"
    if isinstance(error, KafkaError):
        return f"kafka: {error}"
    if isinstance(error, TimeoutError):
        return f"timed out: {error}" if str(error) else "timed out waiting for a database or broker"
    if isinstance(error, OSError):
        return str(error)
    return None
