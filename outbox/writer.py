"""Adding events to the caller's open transaction (sync ``Session`` or ``AsyncSession``)."""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal

from cloudevents.core.v1.event import CloudEvent
from outboxkit.outbox import wal_at_commit, wal_message
from outboxkit.outbox.dialects import Dialect, dialect_of
from outboxkit.outbox.errors import InvalidEventError
from outboxkit.outbox.events import EncodedEvent, encode_binary
from outboxkit.outbox.sharding import shard_for
from outboxkit.outbox.tables import outbox_events
from outboxkit.outbox.telemetry import current_context_headers
from outboxkit.outbox.together import rows_when
from outboxkit.outbox.wal_message import EMIT
from sqlalchemy import (
    BigInteger,
    BindParameter,
    ColumnElement,
    Insert,
    bindparam,
    case,
    literal,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import TextClause

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


class Outbox:
    """Writes CloudEvents into the outbox table inside the caller's transaction.

    It never commits: the event exists exactly when the caller's transaction commits. Topics are
    chosen per call (``topic=``), else from ``topics`` by event type, else ``default_topic``.

    A second event with the same ``(source, id)`` as a row still in the table is a documented
    no-op: :meth:`add` returns ``False`` and nothing is written, so a deterministic id makes
    publishing idempotent for as long as published rows are retained.

    Scheduled delivery: ``delay_s=`` (seconds from now on the database clock, preferred for
    relative waits) or ``deliver_at=`` (a timezone-aware instant) keeps the event from being
    published before that time, judged on the database clock; a time not in the future means
    now. A scheduled event does not hold back the later events of its key.

    ``wal_messages=True`` (PostgreSQL, for a relay in logical mode only): an unscheduled event
    is written as a transactional WAL message (``pg_logical_emit_message``) instead of a row,
    which is cheaper; it is not deduplicated by ``(source, id)`` (:meth:`add` returns ``True``)
    and is invisible to ``outbox list`` until published. A scheduled event, and any event on
    another database, still goes to the table (scheduling and deduplication need it).

    ``emit_at_commit=True`` (with ``wal_messages=True``, a sync ``Session`` on psycopg 3): the
    message is not executed by :meth:`add` but sent with the transaction's ``COMMIT`` in one
    network round trip (:mod:`outboxkit.outbox.wal_at_commit`), after the session's other
    statements; messages keep their :meth:`add` order, a rollback drops them, and a message
    that fails fails the commit. Elsewhere (``add_async``, asyncpg, inside a savepoint) the
    message is executed at once as with ``wal_messages=True`` alone; a savepoint sends the
    messages kept before it as it begins, so its rollback drops only its own events. A session
    dropped without commit or close never publishes its kept messages.
    """

    def __init__(
        self,
        topics: Mapping[str, str] | None = None,
        default_topic: str | None = None,
        *,
        wal_messages: bool = False,
        emit_at_commit: bool = False,
    ) -> None:
        if emit_at_commit and not wal_messages:
            raise ValueError("emit_at_commit=True needs wal_messages=True")
        self.topics = dict(topics or {})
        self.default_topic = default_topic
        self.wal_messages = wal_messages
        self.emit_at_commit = emit_at_commit
        for topic in [*self.topics.values(), default_topic]:
            if topic is not None:
                _check_topic(topic)

    def topic_for(self, event_type: str, topic: str | None = None) -> str:
        """Return the topic for an event type, or raise :class:`InvalidEventError` if none."""
        chosen = topic or self.topics.get(event_type) or self.default_topic
        if chosen is None:
            raise InvalidEventError(
                f"no topic for event type {event_type!r}: pass topic= or configure topics"
            )
        _check_topic(chosen)
        return chosen

    def add(
        self,
        session: Session,
        event: CloudEvent,
        *,
        topic: str | None = None,
        deliver_at: datetime | None = None,
        delay_s: float | None = None,
    ) -> bool:
        """Add ``event`` to the session's transaction; return ``False`` if it was a duplicate.

        ``deliver_at`` (timezone-aware) or ``delay_s``, at most one: not published before then.
        """
        if not isinstance(session, Session):  # an AsyncSession is not a Session
            raise TypeError("Outbox.add takes a sync Session; use 'await outbox.add_async(...)'")
        dialect = dialect_of(session)
        statement, values = self._insert(dialect, event, topic, deliver_at, delay_s)
        if statement is EMIT:
            if self.emit_at_commit and wal_at_commit.can_defer(session):
                wal_at_commit.defer(session, values["content"])
                return True
            session.execute(statement, values)
            return True
        return session.execute(statement, values).first() is not None

    async def add_async(
        self,
        session: AsyncSession,
        event: CloudEvent,
        *,
        topic: str | None = None,
        deliver_at: datetime | None = None,
        delay_s: float | None = None,
    ) -> bool:
        """Add ``event`` to the async session's transaction; ``False`` if it was a duplicate.

        ``deliver_at`` (timezone-aware) or ``delay_s``, at most one: not published before then.
        """
        if not isinstance(session, AsyncSession):
            raise TypeError("Outbox.add_async takes an AsyncSession; use outbox.add(...)")
        dialect = dialect_of(session)
        statement, values = self._insert(dialect, event, topic, deliver_at, delay_s)
        if statement is EMIT:
            await session.execute(statement, values)
            return True
        return (await session.execute(statement, values)).first() is not None

    async def add_all_async(
        self, session: AsyncSession, events: Sequence[CloudEvent], *, topic: str | None = None
    ) -> int:
        """Add ``events`` (unscheduled) to the async session's transaction in one statement;
        return how many were written (duplicates of rows still in the table are skipped).

        The rows are written in the order given, so a key's events keep that order. With
        ``wal_messages=True`` every event is counted (messages are not deduplicated).
        """
        if not isinstance(session, AsyncSession):
            raise TypeError("Outbox.add_all_async takes an AsyncSession")
        if not events:
            return 0
        dialect = dialect_of(session)
        inserts = [self._insert(dialect, event, topic, None, None) for event in events]
        statement = inserts[0][0]
        values = [value for _, value in inserts]
        if statement is EMIT:
            await session.execute(statement, values)
            return len(values)
        return len((await session.execute(statement, values)).all())

    def rows_for(
        self, dialect: Dialect, events: Sequence[CloudEvent], *, topic: str | None = None
    ) -> list[dict[str, Any]] | None:
        """The outbox rows of ``events`` (unscheduled), for a store that writes them inside a
        statement of its own (:func:`rows_after`); ``None`` when this outbox sends WAL
        messages instead of rows (they cannot go in a CTE: use :meth:`add_all_async`)."""
        inserts = [self._insert(dialect, event, topic, None, None) for event in events]
        if any(statement is EMIT for statement, _ in inserts):
            return None
        return [values for _, values in inserts]

    def _insert(
        self,
        dialect: Dialect,
        event: CloudEvent,
        topic: str | None,
        deliver_at: datetime | None,
        delay_s: float | None,
    ) -> tuple[Insert | TextClause, dict[str, Any]]:
        schedule = schedule_of(deliver_at, delay_s)
        encoded = with_origin_trace(encode_binary(event))
        topic = self.topic_for(encoded.type, topic)
        values = outbox_row(encoded, topic)
        if schedule is None:
            if self.wal_messages and dialect.logical_replication:
                return EMIT, {"content": wal_message.encode(values)}
            return insert_statement(dialect.name), values
        kind, values["due_ms"] = schedule
        return insert_statement(dialect.name, kind), values


Schedule = Literal["at", "delay"]


def schedule_of(deliver_at: datetime | None, delay_s: float | None) -> tuple[Schedule, int] | None:
    """``("at", epoch ms)``, ``("delay", ms)`` or ``None`` (publish now); raises
    :class:`InvalidEventError` for a naive datetime, a delay that is not a finite number, or
    both given."""
    if deliver_at is not None and delay_s is not None:
        raise InvalidEventError("give deliver_at= or delay_s=, not both")
    if deliver_at is not None:
        if not isinstance(deliver_at, datetime):
            raise InvalidEventError(f"deliver_at must be a datetime, not {type(deliver_at)!r}")
        if deliver_at.tzinfo is None or deliver_at.utcoffset() is None:
            raise InvalidEventError(
                "deliver_at must be timezone-aware (e.g. datetime.now(UTC) + ...): a naive "
                "datetime names no instant"
            )
        return "at", math.floor(deliver_at.timestamp() * 1000)
    if delay_s is not None:
        if isinstance(delay_s, bool) or not isinstance(delay_s, int | float):
            raise InvalidEventError(f"delay_s must be a number of seconds, not {delay_s!r}")
        if not math.isfinite(delay_s):
            raise InvalidEventError(f"delay_s must be finite, not {delay_s!r}")
        return "delay", math.ceil(delay_s * 1000)
    return None


def with_origin_trace(encoded: EncodedEvent) -> EncodedEvent:
    """Add the current trace context as the event's ``traceparent``/``tracestate`` extension.

    An event that already carries them keeps its own (the originating trace wins).
    """
    context = current_context_headers()
    if not context:
        return encoded
    origin = {f"ce_{name}": value for name, value in context.items()}
    return replace(encoded, headers={**origin, **encoded.headers})


@functools.cache
def insert_statement(dialect_name: str, schedule: Schedule | None = None) -> Insert:
    """The idempotent INSERT of one outbox row (``ON CONFLICT DO NOTHING``), built once.

    Values come as parameters (see :func:`outbox_row`); the creation time is the database's
    clock. Building the statement per call cost more than the round trip it sends.
    ``schedule``: the row has a ``due_ms`` parameter too, an epoch time (``"at"``) or a delay
    added to the database's clock (``"delay"``); a due time not in the future leaves the row
    unscheduled, so it is published like any other (in write order with its key).
    """
    dialect = dialect_of(dialect_name)
    now_ms = dialect.now_ms()
    columns: dict[str, BindParameter[Any] | ColumnElement[Any]] = {
        name: bindparam(name) for name in _ROW_COLUMNS
    }
    if schedule is not None:
        due: ColumnElement[int] = bindparam("due_ms", type_=BigInteger)
        if schedule == "delay":
            columns["deliver_at_ms"] = case((due > 0, now_ms + due), else_=None)
        else:
            columns["deliver_at_ms"] = case((due > now_ms, due), else_=None)
    return dialect.insert_or_skip(
        outbox_events, ["source", "event_id"], returning=[outbox_events.c.id]
    ).values(**columns, created_ms=now_ms, available_ms=now_ms, attempts=0)


@functools.cache
def rows_after(dialect: Dialect, count: int, prefix: str = "event") -> Insert:
    """The insert of ``count`` outbox rows (:meth:`Outbox.rows_for`, as
    :func:`~outboxkit.outbox.together.row_parameters` with ``prefix``) written only when the
    statement's change changed a row (:func:`~outboxkit.outbox.together.rows_when`), in the
    order given; duplicates of rows in the table are skipped, as :func:`insert_statement`
    does. Built once per shape."""
    now_ms = dialect.now_ms()
    return rows_when(
        dialect,
        outbox_events,
        _ROW_COLUMNS,
        count,
        prefix,
        fixed=(("created_ms", now_ms), ("available_ms", now_ms), ("attempts", literal(0))),
        skip_conflicts=("source", "event_id"),
    )


_ROW_COLUMNS = ("source", "event_id", "type", "topic", "kafka_key", "shard", "headers", "payload")


def outbox_row(encoded: EncodedEvent, topic: str) -> dict[str, Any]:
    """Parameters of :func:`insert_statement` for ``encoded`` (the row minus its times)."""
    return {
        "source": encoded.source,
        "event_id": encoded.id,
        "type": encoded.type,
        "topic": topic,
        "kafka_key": encoded.key,
        "shard": shard_for(encoded.key, encoded.id),
        "headers": json.dumps(encoded.headers, separators=(",", ":")),
        "payload": encoded.payload,
    }


def _check_topic(topic: str) -> None:
    if not _TOPIC_NAME.match(topic) or topic in (".", ".."):
        raise InvalidEventError(f"invalid Kafka topic name {topic!r}")
