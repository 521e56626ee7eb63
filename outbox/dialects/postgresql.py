"""PostgreSQL: row locks, RETURNING, arrays, LISTEN/NOTIFY and logical decoding."""

from __future__ import annotations

from typing import Any

from outboxkit.outbox.dialects.base import Dialect, _Query
from outboxkit.outbox.extras import POSTGRES
from sqlalchemy import any_, bindparam, func, true
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import TableClause
from sqlalchemy.types import TypeEngine


class PostgreSQL(Dialect):
    """PostgreSQL through asyncpg (async) and psycopg 3 (sync)."""

    name = "postgresql"
    async_driver = "postgresql+asyncpg"
    sync_driver = "postgresql+psycopg"
    title = "PostgreSQL"
    drivers_extra = POSTGRES
    async_module = "asyncpg"
    sync_module = "psycopg"
    now_ms_sql = "(floor(extract(epoch from clock_timestamp()) * 1000))::bigint"
    # statement_timestamp() is stable: the planner evaluates it to estimate a range.
    statement_now_ms_sql = "(floor(extract(epoch from statement_timestamp()) * 1000))::bigint"
    # Two array parameters whatever the count; the bound only keeps statements short.
    claim_chunk = 1_000
    listen_notify = True
    logical_replication = True
    array_parameters = True
    single_writer = False
    autocommit_statements = True
    writes_in_one_statement = True
    batch_alter_table = False
    url_tls = True
    file_database = False
    time_partitions = True
    autovacuum = True

    def connect_timeout_args(self, timeout_s: float) -> dict[str, Any]:
        """asyncpg's connection timeout."""
        return {"timeout": timeout_s}

    def bounded_sync_args(self, timeout_s: float) -> dict[str, Any]:
        """libpq's ``connect_timeout`` (whole seconds, at least 1) and the session's
        ``statement_timeout``/``lock_timeout``."""
        timeout_ms = int(timeout_s * 1000)
        return {
            "connect_timeout": max(1, int(timeout_s)),
            "options": f"-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms}",
        }

    def insert(self, table: TableClause) -> postgresql.Insert:
        """PostgreSQL's ``INSERT ... ON CONFLICT``."""
        return postgresql.insert(table)

    def claim_skip_locked(self, query: _Query) -> _Query:
        """``FOR UPDATE SKIP LOCKED``."""
        return query.with_for_update(skip_locked=True)

    def lock(self, query: _Query) -> _Query:
        """``FOR UPDATE``."""
        return query.with_for_update()

    def in_list(
        self, column: ColumnElement[Any], name: str, item_type: TypeEngine[Any]
    ) -> ColumnElement[bool]:
        """``column = ANY(:name)``, the list one array parameter."""
        condition: ColumnElement[bool] = column == any_(
            bindparam(name, type_=postgresql.ARRAY(item_type))
        )
        return condition

    def local_timeouts(self, lock_ms: int, statement_ms: int) -> list[ColumnElement[Any]]:
        """``set_config('lock_timeout'/'statement_timeout', ..., true)``: local to the
        transaction."""
        return [
            func.set_config("lock_timeout", f"{lock_ms}ms", true()),
            func.set_config("statement_timeout", f"{statement_ms}ms", true()),
        ]

    def commit_without_flush(self) -> ColumnElement[bool]:
        """``set_config('synchronous_commit', 'off', true)``: local to the transaction, even
        the implicit one of a statement in autocommit, and read when it commits."""
        setting = func.set_config("synchronous_commit", "off", true())
        condition: ColumnElement[bool] = setting == "off"
        return condition
