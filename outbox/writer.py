"""Adding events to the caller's open transaction (sync ``Session`` or ``AsyncSession``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from cloudevents.core.v1.event import CloudEvent
from sqlalchemy import Insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from outbox.clock import db_now_ms
from outbox.dialects import dialect_insert
from outbox.errors import InvalidEventError
from outbox.events import EncodedEvent, encode_binary
from outbox.sharding import shard_for
from outbox.tables import outbox_events
from outbox.telemetry import current_context_headers

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


class Outbox:
    """Writes CloudEvents into the outbox table inside the caller's transaction.

    It never commits: the event exists exactly when the caller's transaction commits. Topics are
    chosen per call (``topic=``), else from ``topics`` by event type, else ``default_topic``.

    A second event with the same ``(source, id)`` as a row still in the table is a documented
    no-op: :meth:`add` returns ``False`` and nothing is written, so a deterministic id makes
    publishing idempotent for as long as published rows are retained.
    """

    def __init__(
        self, topics: Mapping[str, str] | None = None, default_topic: str | None = None
    ) -> None:
        self.topics = dict(topics or {})
        self.default_topic = default_topic
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

    def add(self, session: Session, event: CloudEvent, *, topic: str | None = None) -> bool:
        """Add ``event`` to the session's transaction; return ``False`` if it was a duplicate."""
        if isinstance(session, AsyncSession) or not isinstance(session, Session):
            raise TypeError("Outbox.add takes a sync Session; use 'await outbox.add_async(...)'")
        statement = self._insert(session.get_bind().dialect.name, event, topic)
        return session.execute(statement).first() is not None

    async def add_async(
        self, session: AsyncSession, event: CloudEvent, *, topic: str | None = None
    ) -> bool:
        """Add ``event`` to the async session's transaction; ``False`` if it was a duplicate."""
        if not isinstance(session, AsyncSession):
            raise TypeError("Outbox.add_async takes an AsyncSession; use outbox.add(...)")
        statement = self._insert(session.get_bind().dialect.name, event, topic)
        return (await session.execute(statement)).first() is not None

    def _insert(self, dialect_name: str, event: CloudEvent, topic: str | None) -> Insert:
        encoded = with_origin_trace(encode_binary(event))
        return insert_encoded(dialect_name, encoded, self.topic_for(encoded.type, topic))


def with_origin_trace(encoded: EncodedEvent) -> EncodedEvent:
    """Add the current trace context as the event's ``traceparent``/``tracestate`` extension.

    An event that already carries them keeps its own (the originating trace wins).
    """
    context = current_context_headers()
    if not context:
        return encoded
    origin = {f"ce_{name}": value for name, value in context.items()}
    return replace(encoded, headers={**origin, **encoded.headers})


def insert_encoded(dialect_name: str, encoded: EncodedEvent, topic: str) -> Insert:
    """Build the idempotent INSERT of one encoded event (``ON CONFLICT DO NOTHING``)."""
    values = outbox_row(encoded, topic, db_now_ms(dialect_name))
    return (
        dialect_insert(dialect_name)(outbox_events)
        .values(values)
        .on_conflict_do_nothing(index_elements=["source", "event_id"])
        .returning(outbox_events.c.id)
    )


def outbox_row(encoded: EncodedEvent, topic: str, now_ms: Any) -> dict[str, Any]:
    """Column values of the outbox row for ``encoded``; ``now_ms`` is a value or SQL expression."""
    return {
        "source": encoded.source,
        "event_id": encoded.id,
        "type": encoded.type,
        "topic": topic,
        "kafka_key": encoded.key,
        "shard": shard_for(encoded.key, encoded.id),
        "headers": json.dumps(encoded.headers, separators=(",", ":")),
        "payload": encoded.payload,
        "created_ms": now_ms,
        "available_ms": now_ms,
        "attempts": 0,
    }


def _check_topic(topic: str) -> None:
    if not _TOPIC_NAME.match(topic) or topic in (".", ".."):
        raise InvalidEventError(f"invalid Kafka topic name {topic!r}")
