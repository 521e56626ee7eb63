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
from enum import StrEnum

from aiokafka.errors import KafkaConnectionError
from outboxkit.outbox.errors import OutboxError, PermanentError, TransientError
from outboxkit.outbox.secrecy import sqlstate
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError, OperationalError

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


def error_class(category: str, error: BaseException) -> str:
    """The dead-letter ``error class`` header value, e.g. ``permanent:ValidationError``."""
    return f"{category}:{type(error).__name__}"
