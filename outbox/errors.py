"""Exceptions raised by the outbox API."""


class OutboxError(Exception):
    """Base class of every error outboxkit raises on purpose."""

    outboxkit_safe_message = True  # its messages are built by outboxkit (outbox/secrecy.py)


class InvalidEventError(OutboxError, ValueError):
    """An event cannot be written: a required attribute, its data or its topic is wrong."""


class UnsupportedDatabaseError(OutboxError, ValueError):
    """A database outboxkit does not support (it supports PostgreSQL and SQLite): a session
    bound to one, or a URL with another scheme."""


class NotMigratedError(OutboxError):
    """The database lacks a table of outboxkit's: ``outboxkit migrate`` (or
    :func:`outboxkit.migrations.upgrade`) was not run on it."""


class InvalidDatabaseUrlError(OutboxError, ValueError):
    """A database URL outboxkit cannot use (``--db-url``, ``OUTBOXKIT_DB_URL``): not a URL, or
    a bad TLS parameter; the message says which part, in one line, without the password."""


# What user code raises to say how a failure should be treated. Consumers' handlers and agent
# actions share these three, so one vocabulary covers both (see docs/consumers.md and
# docs/agent-actions.md).


class TransientError(Exception):
    """Retry this: it failed for now and may succeed later (for an action: it certainly did not
    take effect)."""

    outboxkit_safe_message = True  # raised on purpose, its message written to be read


class PermanentError(Exception):
    """Never retry this: it will fail the same way again (a consumer dead-letters the record; an
    action ends FAILED_FINAL). Subclass it to name the reason."""

    outboxkit_safe_message = True  # raised on purpose, its message written to be read


class OutcomeUnknownError(Exception):
    """An action's call may or may not have taken effect: never retried blindly, reconciled."""

    outboxkit_safe_message = True  # raised on purpose, its message written to be read
