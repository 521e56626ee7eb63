"""The classification of every failure of a record, and the consumer's own errors.

A handler raises :class:`~outboxkit.outbox.errors.TransientError` ("retry this") or
:class:`~outboxkit.outbox.errors.PermanentError` ("never retry this") on purpose. A failure is
either *permanent* (retrying cannot help: the record goes to the dead-letter topic at once) or
retried with backoff up to a bound. Exceptions outboxkit does not know are retried
like transient ones, so a bug in a handler costs a few attempts before its record is
dead-lettered as ``exhausted:<Exception>``.
"""

from __future__ import annotations

import asyncio
import traceback
from enum import StrEnum
from pathlib import Path

from aiokafka.errors import KafkaConnectionError
from outboxkit.outbox.errors import OutboxError, PermanentError, TransientError
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError, OperationalError

MAX_MESSAGE_CHARS = 300

# PostgreSQL SQLSTATEs worth another attempt: serialization_failure, deadlock_detected.
_RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})


class NoHandlerError(PermanentError):
    """No handler takes this event type on this topic (dead-lettered when so configured)."""


class ConsumerError(OutboxError):
    """The consumer cannot run as configured (e.g. its inbox table is missing)."""


class HandlerTimeoutError(TransientError):
    """A handler call ran longer than its timeout and was cancelled (retried like transient)."""


class StopTimeoutError(ConsumerError):
    """:meth:`ConsumerRuntime.stop` passed its deadline with handlers still running.

    The work was cancelled and the runtime closed; a handler running in a thread may still
    run, so a process should exit now (``outboxkit consume`` exits with code 4).
    """


class Category(StrEnum):
    """How the runtime treats a failure."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    UNKNOWN = "unknown"


def classify(error: BaseException) -> Category:
    """Return whether ``error`` is permanent, transient, or unknown (retried like transient)."""
    if isinstance(error, PermanentError | ValidationError):
        return Category.PERMANENT
    if isinstance(error, TransientError | asyncio.TimeoutError | ConnectionError):
        return Category.TRANSIENT
    if isinstance(error, OperationalError):
        return Category.TRANSIENT
    if isinstance(error, DBAPIError) and (
        error.connection_invalidated or sqlstate(error) in _RETRYABLE_SQLSTATES
    ):
        return Category.TRANSIENT
    return Category.UNKNOWN


def unreachable(error: BaseException) -> bool:
    """Whether ``error`` says a dependency cannot be reached now (the broker, the database),
    as opposed to a mistake that waiting cannot mend (a missing table, a bad option)."""
    if isinstance(error, KafkaConnectionError | OSError | asyncio.TimeoutError):
        return True
    return isinstance(error, OperationalError) or (
        isinstance(error, DBAPIError) and error.connection_invalidated
    )


def sqlstate(error: DBAPIError) -> str | None:
    """The SQLSTATE of a database error (asyncpg and psycopg spell it differently), if any."""
    original = error.orig
    code = getattr(original, "pgcode", None) or getattr(original, "sqlstate", None)
    return code if isinstance(code, str) else None


def safe_message(error: BaseException) -> str:
    """A short description of ``error`` that carries no payload and no secret.

    Only exceptions whose text outboxkit or the handler author controls keep their message:
    ``TransientError``/``PermanentError`` (the decoding errors are permanent ones) and pydantic
    validation errors, summarised without their input values. Database errors give their class
    and SQLSTATE (a PostgreSQL message may quote the offending value). Any other exception gives
    only its class and where it was raised, since messages like ``invalid literal for int():
    'secret'`` quote the data.
    """
    if isinstance(error, ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or '<data>'}: {item['msg']}"
            for item in error.errors(include_url=False, include_context=False, include_input=False)
        )
        text = f"{error.error_count()} validation error(s) for {error.title}: {problems}"
    elif isinstance(error, TransientError | PermanentError):
        lines = str(error).strip().splitlines()
        text = lines[0] if lines else type(error).__name__
    elif isinstance(error, DBAPIError):
        original = type(error.orig).__name__ if error.orig is not None else "unknown"
        code = sqlstate(error)
        text = f"database error {type(error).__name__} ({original}" + (
            f", sqlstate {code})" if code else ")"
        )
        if error.connection_invalidated:
            text += ", connection invalidated"
    else:
        text = f"{type(error).__name__} raised{_where(error)} (message withheld)"
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    if not frames:
        return ""
    last = frames[-1]
    return f" at {Path(last.filename).name}:{last.lineno}"


def error_class(category: str, error: BaseException) -> str:
    """The dead-letter ``error class`` header value, e.g. ``permanent:ValidationError``."""
    return f"{category}:{type(error).__name__}"
