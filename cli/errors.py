"""How the CLI ends: one line on stderr for an error an operator can fix, and its exit code.

Every command shares one table of exit codes (docs/operations.md#exit-codes):

| code | meaning |
| --- | --- |
| 0 | done; nothing crossed a threshold; a long-running command stopped by SIGTERM/SIGINT |
| 1 | a threshold was crossed (``status``) |
| 2 | a usage error, or an operational error an operator can fix (unreachable, refused, a bad
  database URL, tables not migrated) |
| 3 | ``status`` only: a source (the database, the broker, a topic) could not be read; for
  ``status`` an unmigrated database is such a source (exit 3, not 2) |
| 4 | ``consume``: stopped with work still running (handlers past the stop deadline) |
| 5 | ``consume``: a handler raised ``KeyboardInterrupt`` or ``SystemExit``; its record's offset
  is not committed |
| 70 | a bug: an unexpected exception, printed with its traceback (EX_SOFTWARE) |
| 130 | interrupted (Ctrl-C) during a command that ends on its own |

Exit 1 from the interpreter on an unexpected exception would read as "threshold crossed", so
:func:`outboxkit.cli.main.run_app` turns one into 70.
"""

from __future__ import annotations

import typer
from aiokafka.errors import KafkaError
from outboxkit.outbox.db_failures import tls_failure
from outboxkit.outbox.errors import OutboxError
from sqlalchemy.exc import ArgumentError, DBAPIError

EXIT_OK = 0
EXIT_THRESHOLD = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_STOPPED_STUCK = 4
EXIT_HANDLER_INTERRUPTED = 5
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
    if (tls := tls_failure(error)) is not None:
        return tls  # one wording whichever driver met it (outbox/db_failures.py)
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
