"""Decoding PostgreSQL's ``pgoutput`` messages (protocol version 1, binary tuples).

Only what the logical relay reads: Begin, Relation, Insert, Commit and transactional Message
(``pg_logical_emit_message(true, ...)``, sent with the ``messages`` option). Values arrive in
each type's binary send format (the slot is read with ``binary 'true'``): integers big-endian,
bytea raw, text UTF-8. Other messages (Type, Origin, non-transactional messages, and any a
publication would add) are skipped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

_INT = {2: struct.Struct("!h"), 4: struct.Struct("!i"), 8: struct.Struct("!q")}
# OIDs of the types the outbox table uses, and how their binary values are read.
_BYTEA, _TEXT, _VARCHAR = 17, 25, 1043
_INTEGERS = {20: 8, 21: 2, 23: 4}  # int8, int2, int4
_COMMIT = struct.Struct("!BQQq")  # flags, commit LSN, end LSN, commit time
_BEGIN = struct.Struct("!Qqi")  # final LSN, commit time, xid
# Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
_PG_EPOCH_US = 946_684_800_000_000


@dataclass(slots=True)
class Relation:
    """A table as the stream describes it: its name and its columns' names and type OIDs."""

    name: str
    columns: list[str]
    types: list[int]


@dataclass(slots=True)
class Message:
    """A transactional logical decoding message: its LSN, prefix and content."""

    lsn: int
    prefix: str
    content: bytes


@dataclass(slots=True)
class Transaction:
    """One committed transaction: the rows it inserted (column name -> value) and the
    transactional messages it emitted, in one list in WAL order."""

    end_lsn: int
    commit_time_ms: int
    inserts: list[dict[str, Any] | Message] = field(default_factory=list)


class Decoder:
    """Turns the rows of ``pg_logical_slot_peek_binary_changes`` into transactions.

    Relation messages are remembered across calls (the stream sends one before a table's first
    change in each decoding session, and again after the table's definition changed).
    """

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}
        self.current: Transaction | None = None  # begun, not yet committed
        # LSN of the last non-transactional message: every commit before it was decoded.
        self.marker_lsn = 0

    def transactions(self, messages: list[bytes]) -> list[Transaction]:
        """The complete transactions among ``messages`` (a peek returns whole transactions)."""
        done: list[Transaction] = []
        for data in messages:
            transaction = self.feed(data)
            if transaction is not None:
                done.append(transaction)
        return done

    def feed(self, data: bytes) -> Transaction | None:
        """Decode one message of a stream; return the transaction it commits, if it does."""
        kind = data[:1]
        current = self.current
        if kind == b"I":
            assert current is not None, "an insert outside a transaction"
            current.inserts.append(self._insert(data))
        elif kind == b"B":
            _, commit_us, _ = _BEGIN.unpack_from(data, 1)
            self.current = Transaction(end_lsn=0, commit_time_ms=_epoch_ms(commit_us))
        elif kind == b"C":
            assert current is not None, "a commit outside a transaction"
            _, _, current.end_lsn, _ = _COMMIT.unpack_from(data, 1)
            self.current = None
            return current
        elif kind == b"M":
            message = _message(data)
            if data[1] & 1 and current is not None:  # transactional
                current.inserts.append(message)
            else:
                self.marker_lsn = max(self.marker_lsn, message.lsn)
        elif kind == b"R":
            self._relation(data)
        return None

    def _relation(self, data: bytes) -> None:
        (oid,) = _INT[4].unpack_from(data, 1)
        position = 5
        _, position = _cstring(data, position)  # namespace
        name, position = _cstring(data, position)
        position += 1  # replica identity setting
        (count,) = _INT[2].unpack_from(data, position)
        position += 2
        columns, types = [], []
        for _ in range(count):
            position += 1  # flags
            column, position = _cstring(data, position)
            (type_oid,) = _INT[4].unpack_from(data, position)
            position += 8  # type OID and type modifier
            columns.append(column)
            types.append(type_oid)
        self.relations[oid] = Relation(name, columns, types)

    def _insert(self, data: bytes) -> dict[str, Any]:
        (oid,) = _INT[4].unpack_from(data, 1)
        relation = self.relations[oid]
        (count,) = _INT[2].unpack_from(data, 6)  # after the 'N' (new tuple) marker
        position = 8
        values: dict[str, Any] = {"__table__": relation.name}
        for index in range(count):
            kind = data[position]
            position += 1
            if kind in (0x6E, 0x75):  # 'n' null, 'u' unchanged TOAST (never in an insert)
                values[relation.columns[index]] = None
                continue
            (length,) = _INT[4].unpack_from(data, position)
            position += 4
            raw = data[position : position + length]
            position += length
            values[relation.columns[index]] = _value(relation.types[index], raw, kind == 0x62)
        return values


def _value(type_oid: int, raw: bytes, binary: bool) -> Any:
    if not binary:  # 't': text format (a type without a binary send function)
        return raw.decode()
    size = _INTEGERS.get(type_oid)
    if size is not None:
        return _INT[size].unpack(raw)[0]
    if type_oid == _BYTEA:
        return raw
    if type_oid in (_TEXT, _VARCHAR):
        return raw.decode()
    return raw


def _message(data: bytes) -> Message:
    (lsn,) = _INT[8].unpack_from(data, 2)  # after the flags
    prefix, position = _cstring(data, 10)
    (length,) = _INT[4].unpack_from(data, position)
    position += 4
    return Message(lsn, prefix, data[position : position + length])


def _cstring(data: bytes, position: int) -> tuple[str, int]:
    end = data.index(b"\x00", position)
    return data[position:end].decode(), end + 1


def _epoch_ms(postgres_us: int) -> int:
    return (postgres_us + _PG_EPOCH_US) // 1000
