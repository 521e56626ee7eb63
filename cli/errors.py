"""How the CLI ends: one line on stderr for an error an operator can fix, and its exit code.

Every command shares one table of exit codes (docs/operations.md):

| code | meaning |
| --- | --- |
| 0 | done; nothing crossed a threshold |
| 1 | a threshold was crossed (``status``) |
| 2 | a usage error, or an operational error an operator can fix (unreachable, refused) |
| 3 | ``status`` only: a source (the database, the broker, a topic) could not be read |
| 4 | ``consume``: stopped with work still running (handlers past the stop deadline) |
| 130 | interrupted (Ctrl-C) |

Anything else is a bug and ends with Python's traceback (exit 1 from the interpreter would be
ambiguous, so :func:`outboxkit.cli.main.main` turns an unexpected exception into exit 70).
"""

from __future__ import annotations

import typer
from aiokafka.errors import KafkaError
from outboxkit.outbox.errors import OutboxError
from sqlalchemy.exc import ArgumentError, DBAPIError

EXIT_OK = 0
EXIT_THRESHOLD = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_STOPPED_STUCK = 4
EXIT_BUG = 70  # EX_SOFTWARE from sysexits.h
EXIT_INTERRUPTED = 130


class CliError(OutboxError):
    """An error reported to the operator as one line with exit code 2."""


def error_line(error: BaseException) -> str | None:
    """The one line an operator sees for an expected error, or ``None`` for a bug."""
    if isinstance(error, typer.TyperException) and hasattr(error, "format_message"):
        return str(error.format_message())  # click's usage errors, as vendored by typer
    if isinstance(error, OutboxError):
        return str(error)
    if isinstance(error, ArgumentError):
        return f"invalid database URL: {error}"
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
