"""The :class:`Dialect` base class: what a store may ask about its database."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import BigInteger, Insert, bindparam, literal_column
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import GenerativeSelect, TableClause
from sqlalchemy.types import TypeEngine

_Query = TypeVar("_Query", bound=GenerativeSelect)


BlockValue = int | str | Sequence[int]
"""A value given to a locked block: an integer, a string or a list of integers."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A step of a locked block that fails the whole block, changing nothing, with the error
    code ``sqlstate`` (five digits or capital letters) when ``condition`` (SQL, true or false)
    holds. Its work counts in none of the block's rows."""

    condition: str
    sqlstate: str


@dataclass(frozen=True, slots=True)
class LockedBlock:
    """Statements that run as one statement, under a lock timeout, and commit when it ends
    (:meth:`Dialect.locked_block`; :func:`outboxkit.outbox.locked.run_locked` runs one)."""

    sql: str
    """The one statement, sent in autocommit: it takes no parameters."""
    result_notice: str
    """The start of the ``NOTICE`` the block sends as it ends, on its own connection (through a
    transaction-mode pooler too, its server session being the block's), followed by the sum of
    its statements' row counts and the milliseconds it ran in the server from before its first
    statement to its end (its commit excluded), separated by spaces."""
    values_sql: str | None = None
    """Hands the block its values, in settings local to its transaction: sent in the same
    message just before it (its values written in it as literals); ``None`` when it has
    none."""


class Dialect:
    """One supported database, as the stores see it: its facts and the SQL spelled its way.

    A store asks ``dialect_of(session)`` (:func:`outboxkit.outbox.dialects.dialect_of`)
    instead of comparing the database's name; a new database is one subclass in its own
    module, registered in ``outboxkit.outbox.dialects.DIALECTS``.
    """

    name: str
    """SQLAlchemy's name of the database (``engine.dialect.name``, a URL's backend name)."""
    async_driver: str
    """The URL scheme outboxkit's async engines use (``outbox/db.py``)."""
    sync_driver: str
    """The URL scheme of its sync engines (migrations, the sync ``Outbox.add``)."""
    title: str
    """The database's name in messages (``PostgreSQL``)."""
    drivers_extra: str | None
    """The pip extra that installs the drivers (``None``: the base install has them)."""
    async_module: str
    """The async driver's module, imported first to name a missing extra."""
    sync_module: str
    """The sync driver's module."""
    now_ms_sql: str
    """SQL for the database clock in epoch milliseconds (:meth:`now_ms`)."""
    statement_now_ms_sql: str
    """SQL for the database clock at the start of the statement (:meth:`statement_now_ms`)."""
    claim_chunk: int
    """Keys per multi-row claim statement (the inbox's ``claim_many``)."""
    listen_notify: bool
    """LISTEN/NOTIFY exists: triggers notify, relays and workers listen instead of polling."""
    logical_replication: bool
    """Logical decoding exists: WAL messages, publications, replication slots."""
    array_parameters: bool
    """A list binds as one array parameter, so a statement's text does not grow with it."""
    single_writer: bool
    """One writer at a time: transactions take the write lock at ``BEGIN``, and one relay
    holds every shard."""
    autocommit_statements: bool
    """A single statement may run in autocommit (no ``BEGIN``/``COMMIT`` round trips)."""
    driver_statements: bool
    """The async driver's connection runs a compiled statement with positional parameters
    (``fetchrow(sql, *args)``): the hot paths' :class:`~outboxkit.outbox.driver.DriverSession`
    skips SQLAlchemy's session and cursor layers there."""
    writes_in_one_statement: bool
    """Data-modifying CTEs exist (``WITH changed AS (UPDATE ... RETURNING) INSERT ...``): a
    change and the rows that go with it are one statement (:mod:`outboxkit.outbox.together`)."""
    batch_alter_table: bool
    """``ALTER TABLE`` is limited: migrations alter by copying the table (Alembic's batch)."""
    url_tls: bool
    """The URL carries TLS parameters (libpq's ``sslmode``, ...) for the drivers."""

    file_database: bool
    """The URL's database is a file path (or ``:memory:``)."""
    time_partitions: bool
    """Declarative range partitions that attach and detach while writers run: the inbox is
    partitioned by the time in its event ids and retention drops whole partitions
    (:mod:`outboxkit.outbox.partitions`, :mod:`outboxkit.consumers.inbox_partitions`)."""
    locked_blocks: bool
    """Statements can run as one statement that takes their locks only as each runs, under a
    lock timeout set before the first, and commits when it ends (:meth:`locked_block`): no
    client round trip while they hold their locks. Where false, they run in a transaction."""
    autovacuum: bool
    """Deleted rows leave dead tuples that a (background or plain) ``VACUUM`` makes reusable,
    without blocking reads or writes; tables take autovacuum storage parameters (``ALTER
    TABLE ... SET (autovacuum_...)``). Where false, the database reuses freed pages itself."""

    def connect_timeout_args(self, timeout_s: float) -> dict[str, Any]:
        """Async engine ``connect_args`` that give up a connection attempt after ``timeout_s``."""
        return {}

    def statement_timeout_args(self, timeout_s: float) -> dict[str, Any]:
        """Async engine ``connect_args`` that give up any statement after ``timeout_s``, even
        on a server that stopped answering (a client-side bound)."""
        return {}

    def bounded_sync_args(self, timeout_s: float) -> dict[str, Any]:
        """Sync engine ``connect_args`` bounding a connection attempt and each statement (and
        its lock waits) by ``timeout_s``."""
        return {}

    def insert(self, table: TableClause) -> Any:
        """The database's ``INSERT`` construct, with ``on_conflict_do_nothing``/``_do_update``."""
        raise NotImplementedError

    def insert_or_skip(
        self, table: TableClause, conflict: Sequence[str], returning: Sequence[Any] = ()
    ) -> Insert:
        """``INSERT`` unless a row with the same ``conflict`` columns exists; with
        ``returning``, the statement returns those columns of the row it inserted (no row
        when it skipped)."""
        statement = self.insert(table).on_conflict_do_nothing(index_elements=list(conflict))
        result: Insert = statement.returning(*returning) if returning else statement
        return result

    def now_ms(self) -> ColumnElement[int]:
        """A SQL expression for the database's current time in epoch milliseconds."""
        return literal_column(self.now_ms_sql, BigInteger)

    def statement_now_ms(self) -> ColumnElement[int]:
        """The database's time in epoch milliseconds as the statement began: one value for
        the whole statement, which the query planner reads when it estimates. A range bound
        on it (``deliver_at_ms <= ...``) is an index condition planned from the column's
        statistics, where the volatile :meth:`now_ms` leaves the planner guessing a third of
        the rows (docs/operations.md#sizing)."""
        return literal_column(self.statement_now_ms_sql, BigInteger)

    def claim_skip_locked(self, query: _Query) -> _Query:
        """``query`` locking the rows it reads and skipping rows other transactions hold
        (``FOR UPDATE SKIP LOCKED``), where the database has row locks."""
        return query

    def lock(self, query: _Query) -> _Query:
        """``query`` locking the rows it reads for the transaction (``FOR UPDATE``), where
        the database has row locks."""
        return query

    def in_list(
        self, column: ColumnElement[Any], name: str, item_type: TypeEngine[Any]
    ) -> ColumnElement[bool]:
        """``column`` in the list bound as parameter ``name`` (of ``item_type`` items): one
        parameter per item here; one array parameter where the database has them, so the
        statement's text, and its prepared plan, do not change with the list's length."""
        return column.in_(bindparam(name, expanding=True))

    def local_timeouts(self, lock_ms: int, statement_ms: int) -> list[ColumnElement[Any]]:
        """Expressions that, selected first in a transaction, bound each later statement's
        lock wait by ``lock_ms`` and its run by ``statement_ms`` until the transaction ends;
        none where the database has no such settings."""
        return []

    def commit_without_flush(self) -> ColumnElement[bool] | None:
        """A condition that is true and, evaluated in a statement, lets the statement's
        transaction commit without waiting for its log to reach the disk; ``None`` where the
        database has no such setting per transaction."""
        return None

    def locked_block(
        self,
        statements: Sequence[str | Refusal],
        *,
        lock_timeout_ms: int,
        commit_without_flush: bool = False,
        values: Mapping[str, BlockValue] | None = None,
    ) -> LockedBlock | None:
        """``statements`` (SQL text, no parameters) as one statement: each takes its locks
        when it runs, ``lock_timeout_ms`` bounds every lock wait from before the first (a
        wait that reaches it fails the block, which changes nothing), and the block commits
        when it ends (without waiting for its log to reach the disk with
        ``commit_without_flush``), so its locks are taken and released inside the server with
        no client round trip between. ``values`` are variables the statements name (plain
        lower-case names), handed over beside the block's text, which does not change with
        them. A :class:`Refusal` among the statements fails the block where its condition
        holds. ``None`` where the database has none (:attr:`locked_blocks` false): the caller
        runs the statements in a transaction."""
        return None

    def block_value(self, name: str, type_: TypeEngine[Any]) -> ColumnElement[Any]:
        """The value ``name`` given to a locked block (:meth:`locked_block`'s ``values``), as
        its statements name it."""
        raise NotImplementedError(f"{self.title} has no locked blocks")

    def in_block_list(self, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
        """``column`` in the list of integers given to a locked block as ``name``."""
        raise NotImplementedError(f"{self.title} has no locked blocks")
