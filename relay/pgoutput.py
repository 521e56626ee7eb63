"""Decoding PostgreSQL's ``pgoutput`` messages (protocol version 1, binary tuples).

Only what the logical relay reads: Begin, Relation, Insert, Commit and transactional Message
(``pg_logical_emit_message(true, ...)``, sent with the ``messages`` option). Values arrive in
each type's binary send format (the slot is read with ``binary 'true'``): integers big-endian,
bytea raw, text UTF-8. Other messages (Type, Origin, non-transactional messages, and any a
publication would add) are skipped.

The decoder runs once per streamed change, so it does as little as it can: an insert becomes
one tuple of the columns the caller asked for (in the caller's order), the other columns are
skipped without being read, and a table nobody asked for is skipped whole.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

_INT = {2: struct.Struct("!h"), 4: struct.Struct("!i"), 8: struct.Struct("!q")}
# OIDs of the types the outbox table uses, and how their binary values are read.
_TEXT, _VARCHAR = 25, 1043
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
    # Per column, in the stream's order: where its value goes in the decoded tuple (-1: not
    # wanted) and how its binary value is read; ``None`` when no column of the table is wanted.
    plan: list[tuple[int, int]] | None = None
    width: int = 0


@dataclass(slots=True)
class Message:
    """A transactional logical decoding message: its LSN, prefix and content."""

    lsn: int
    prefix: str
    content: bytes


@dataclass(slots=True)
class Transaction:
    """One committed transaction: the rows it inserted (a tuple of the wanted columns'
    values, see :class:`Decoder`) and the transactional messages it emitted, in one list in
    WAL order."""

    end_lsn: int
    commit_time_ms: int
    inserts: list[tuple[Any, ...] | Message] = field(default_factory=list)


class Decoder:
    """Turns pgoutput messages into transactions.

    ``columns`` names, per table, the columns an insert is decoded to, in that order (a column
    the table lacks reads as ``None``); inserts into other tables are skipped. Relation
    messages are remembered across calls (the stream sends one before a table's first change
    in each decoding session, and again after the table's definition changed).
    """

    def __init__(self, columns: dict[str, tuple[str, ...]]) -> None:
        self.columns = columns
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
            values = self._insert(data)
            if values is not None:
                current.inserts.append(values)
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
        relation = Relation(name, columns, types)
        wanted = self.columns.get(name)
        if wanted is not None:
            slots = {column: wanted.index(column) for column in wanted if column in columns}
            relation.plan = [
                (slots.get(column, -1), _reader(type_oid))
                for column, type_oid in zip(columns, types, strict=True)
            ]
            relation.width = len(wanted)
        self.relations[oid] = relation

    def _insert(self, data: bytes) -> tuple[Any, ...] | None:
        (oid,) = _INT[4].unpack_from(data, 1)
        relation = self.relations[oid]
        plan = relation.plan
        if plan is None:
            return None
        values: list[Any] = [None] * relation.width
        position = 8  # after the relation OID, the 'N' (new tuple) marker and the column count
        unpack_length = _INT[4].unpack_from
        for slot, reader in plan:
            kind = data[position]
            position += 1
            if kind == 0x6E or kind == 0x75:  # 'n' null, 'u' unchanged TOAST (not in inserts)
                continue
            (length,) = unpack_length(data, position)
            position += 4
            if slot >= 0:
                end = position + length
                if kind != 0x62:  # 't': text format (a type without a binary send function)
                    values[slot] = data[position:end].decode()
                elif reader == _RAW:
                    values[slot] = data[position:end]
                elif reader == _STR:
                    values[slot] = data[position:end].decode()
                else:
                    values[slot] = _INT[reader].unpack_from(data, position)[0]
            position += length
        return tuple(values)


# How a column's binary value is read: a big-endian integer of 2, 4 or 8 bytes, UTF-8 text, or
# the raw bytes (bytea, and any type the relay does not read).
_RAW, _STR = 0, 1


def _reader(type_oid: int) -> int:
    if type_oid in _INTEGERS:
        return _INTEGERS[type_oid]
    if type_oid in (_TEXT, _VARCHAR):
        return _STR
    return _RAW


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
