"""PostgreSQL: row locks, RETURNING, arrays, LISTEN/NOTIFY and logical decoding."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from outboxkit.outbox.dialects.base import BlockValue, Dialect, LockedBlock, Refusal, _Query
from outboxkit.outbox.extras import POSTGRES
from sqlalchemy import any_, bindparam, func, literal_column, true
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import TableClause
from sqlalchemy.types import TypeEngine

# The dollar quote of a locked block's body, the start of the NOTICE it sends its results in,
# and the prefix of the settings that hand it its values.
_QUOTE = "$outboxkit_block$"
_NOTICE = "outboxkit.block"
_SETTING = "outboxkit.block_value_"
_VARIABLE = re.compile(r"[a-z][a-z0-9_]{0,40}")
_SQLSTATE = re.compile(r"[0-9A-Z]{5}")


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
    driver_statements = True
    writes_in_one_statement = True
    batch_alter_table = False
    url_tls = True
    file_database = False
    time_partitions = True
    locked_blocks = True
    autovacuum = True

    def connect_timeout_args(self, timeout_s: float) -> dict[str, Any]:
        """asyncpg's connection timeout."""
        return {"timeout": timeout_s}

    def statement_timeout_args(self, timeout_s: float) -> dict[str, Any]:
        """asyncpg's ``command_timeout``: it cancels the statement and raises
        :class:`TimeoutError` (an outage to the relay); the pool drops the connection."""
        return {"command_timeout": timeout_s}

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

    def locked_block(
        self,
        statements: Sequence[str | Refusal],
        *,
        lock_timeout_ms: int,
        commit_without_flush: bool = False,
        values: Mapping[str, BlockValue] | None = None,
    ) -> LockedBlock:
        """A PL/pgSQL ``DO`` block, sent in autocommit: its statements take their table
        locks when each runs (a plain statement takes them when it is parsed, before any
        ``set_config`` in it), so the ``lock_timeout`` it sets first bounds all of them; its
        implicit transaction commits when it ends. ``GET DIAGNOSTICS`` sums the row counts,
        which the block sends back in a ``NOTICE`` as it ends (a ``DO`` returns nothing), with
        the time it ran by ``clock_timestamp()``: in the block's own reply, so on its server
        session even through a transaction-mode pooler, with no round trip more (a session
        setting read by a second statement could be another session's). ``client_min_messages``
        is set to ``notice`` for the block's transaction, so a client that asked for fewer
        messages still gets it.

        A ``DO`` takes no parameters: ``values`` travel in settings local to the block's
        transaction, set by a ``SELECT set_config(..., true)`` sent in the same message just
        before it (:func:`~outboxkit.outbox.driver.send_script`: one implicit transaction, on
        one server session even through a transaction-mode pooler, so no other block's values
        can be read), and the block declares them as its variables (``bigint``, ``text`` or
        ``bigint[]``), which PL/pgSQL binds into its statements as parameters. So the block's
        text is the same for every chunk, and ``pg_stat_statements``, which tracks a ``DO`` by
        its text, keeps one entry for it instead of one per chunk (it files the ``SELECT`` by
        its shape, its values taken out)."""
        given = dict(values or {})
        declared = ["total bigint := 0;", "changed bigint;", "started timestamptz;"]
        texts: dict[str, str] = {}
        for name, value in given.items():
            if _VARIABLE.fullmatch(name) is None:
                raise ValueError(f"not a plain variable name: {name!r}")
            kind, texts[name] = _typed(value)
            declared.append(f"{name} {kind} := current_setting('{_SETTING}{name}')::{kind};")
        lines = [
            f"DO {_QUOTE}",
            "DECLARE " + " ".join(declared),
            "BEGIN",
            f"PERFORM set_config('lock_timeout', '{int(lock_timeout_ms)}ms', true);",
        ]
        if commit_without_flush:
            lines.append("PERFORM set_config('synchronous_commit', 'off', true);")
        lines.append("started := clock_timestamp();")
        for statement in statements:
            if _QUOTE in str(statement):
                raise ValueError(f"a locked block's statement may not contain {_QUOTE}")
            if isinstance(statement, Refusal):
                if _SQLSTATE.fullmatch(statement.sqlstate) is None:
                    raise ValueError(f"not an error code: {statement.sqlstate!r}")
                # No GET DIAGNOSTICS after it: evaluating the condition sets ROW_COUNT.
                lines.append(
                    f"IF ({statement.condition}) THEN RAISE EXCEPTION 'refused by the block'"
                    f" USING ERRCODE = '{statement.sqlstate}'; END IF;"
                )
                continue
            lines += [f"{statement};", "GET DIAGNOSTICS changed = ROW_COUNT;"]
            lines.append("total := total + changed;")
        lines += [
            "PERFORM set_config('client_min_messages', 'notice', true);",
            f"RAISE NOTICE '{_NOTICE} % %', total,"
            " extract(epoch FROM clock_timestamp() - started) * 1000;",
            "END",
            _QUOTE,
        ]
        handing = ", ".join(
            f"set_config('{_SETTING}{name}', {_quoted(value)}, true)"
            for name, value in texts.items()
        )
        return LockedBlock(
            sql="\n".join(lines),
            result_notice=_NOTICE,
            values_sql=f"SELECT {handing}" if texts else None,
        )

    def block_value(self, name: str, type_: TypeEngine[Any]) -> ColumnElement[Any]:
        """The block's variable ``name``: PL/pgSQL binds it into the statement."""
        return literal_column(name, type_)

    def in_block_list(self, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
        """``column = ANY(name)``, the block's ``bigint[]`` variable."""
        condition: ColumnElement[bool] = column == any_(literal_column(name))
        return condition


def _quoted(text: str) -> str:
    """``text`` as a string literal, whatever ``standard_conforming_strings`` says."""
    return "E'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _typed(value: BlockValue) -> tuple[str, str]:
    """A block value's PostgreSQL type and its text."""
    if isinstance(value, bool):
        raise TypeError("a block value is an integer, a string or a list of integers")
    if isinstance(value, int):
        return "bigint", str(value)
    if isinstance(value, str):
        return "text", value
    return "bigint[]", "{" + ",".join(str(int(item)) for item in value) + "}"
