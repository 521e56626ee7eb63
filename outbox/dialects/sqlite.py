"""SQLite: one writer at a time, no row locks, no LISTEN, parameters bound one by one."""

from __future__ import annotations

from outboxkit.outbox.dialects.base import Dialect
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql.selectable import TableClause


class SQLite(Dialect):
    """SQLite through aiosqlite (async) and pysqlite (sync); needs 3.35+ for RETURNING."""

    name = "sqlite"
    async_driver = "sqlite+aiosqlite"
    sync_driver = "sqlite"
    title = "SQLite"
    drivers_extra = None
    async_module = "aiosqlite"
    sync_module = "sqlite3"
    now_ms_sql = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
    # 'now' is already one value for the whole statement.
    statement_now_ms_sql = now_ms_sql
    # Four parameters per key (consumer, source, id, the id's time); older builds allow 999.
    claim_chunk = 240
    listen_notify = False
    logical_replication = False
    array_parameters = False
    single_writer = True
    autocommit_statements = False
    driver_statements = False
    writes_in_one_statement = False
    batch_alter_table = True
    url_tls = False
    file_database = True
    time_partitions = False
    locked_blocks = False
    autovacuum = False

    def insert(self, table: TableClause) -> sqlite.Insert:
        """SQLite's ``INSERT ... ON CONFLICT``."""
        return sqlite.insert(table)
