"""Exceptions raised by the outbox API."""


class OutboxError(Exception):
    """Base class of every error outboxkit raises on purpose."""


class InvalidEventError(OutboxError, ValueError):
    """An event cannot be written: a required attribute, its data or its topic is wrong."""


class UnsupportedDatabaseError(OutboxError):
    """The session is bound to a database outboxkit does not support (PostgreSQL, SQLite)."""
