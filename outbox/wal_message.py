"""Outbox events as transactional WAL messages (``pg_logical_emit_message``), PostgreSQL only.

``Outbox(wal_messages=True)`` writes an event as a logical decoding message in the caller's
transaction instead of a row: no table write, no index entries, nothing to delete once
published. The relay in logical mode decodes it from the slot with the inserts, in commit order.
The content is the outbox row's fields in a small binary format (version 1): the four text
fields with 2-byte lengths, then the key (4-byte length, ``0xFFFFFFFF`` for none), the headers
(JSON text) and the payload with 4-byte lengths, all big-endian.
"""

from __future__ import annotations

import struct
from typing import Any

from outboxkit.outbox.errors import OutboxError
from sqlalchemy import LargeBinary, bindparam, text
from sqlalchemy.sql.elements import TextClause

PREFIX = "outboxkit"


class UnreadableMessageError(OutboxError, ValueError):
    """A WAL message of outboxkit's prefix in a format this version cannot read."""


_VERSION = 1
_VERSION_BYTE = bytes((_VERSION,))
_SHORT = struct.Struct("!H")
_LONG = struct.Struct("!I")
_NO_KEY = 0xFFFFFFFF
_TEXTS = ("source", "event_id", "type", "topic")

EMIT: TextClause = text(f"SELECT pg_logical_emit_message(true, '{PREFIX}', :content)").bindparams(
    bindparam("content", type_=LargeBinary)
)
"""The statement writing one message; its parameter is ``content`` (:func:`encode`)."""


def encode(row: dict[str, Any]) -> bytes:
    """The message content for an outbox row's values
    (:func:`outboxkit.outbox.writer.outbox_row`)."""
    parts = [bytes((_VERSION,))]
    for name in _TEXTS:
        value = row[name].encode()
        parts += [_SHORT.pack(len(value)), value]
    key: bytes | None = row["kafka_key"]
    parts.append(_LONG.pack(_NO_KEY if key is None else len(key)))
    if key is not None:
        parts.append(key)
    headers = row["headers"].encode()
    parts += [_LONG.pack(len(headers)), headers, _LONG.pack(len(row["payload"])), row["payload"]]
    return b"".join(parts)


def decode(content: bytes) -> dict[str, Any]:
    """The row values :func:`encode` wrote (``source``, ``event_id``, ``type``, ``topic``,
    ``kafka_key``, ``headers``, ``payload``); raises :class:`ValueError` for another format."""
    return dict(zip(FIELDS, unpack(content), strict=True))


FIELDS = (*_TEXTS, "kafka_key", "headers", "payload")
"""The names of :func:`unpack`'s values, in order."""


def unpack(content: bytes) -> tuple[str, str, str, str, bytes | None, str, bytes]:
    """The values of :func:`decode` as one tuple, in the order of :data:`FIELDS` (the relay
    decodes every message it publishes: no dictionary per message)."""
    if content[:1] != _VERSION_BYTE:
        raise UnreadableMessageError(f"unknown outbox message version {content[:1]!r}")
    unpack_short, unpack_long = _SHORT.unpack_from, _LONG.unpack_from
    position = 1
    texts = []
    for _ in range(4):
        (length,) = unpack_short(content, position)
        position += 2
        texts.append(content[position : position + length].decode())
        position += length
    (length,) = unpack_long(content, position)
    position += 4
    key = None
    if length != _NO_KEY:
        key = content[position : position + length]
        position += length
    (length,) = unpack_long(content, position)
    position += 4
    headers = content[position : position + length].decode()
    position += length
    (length,) = unpack_long(content, position)
    position += 4
    source, event_id, event_type, topic = texts
    return source, event_id, event_type, topic, key, headers, content[position : position + length]
