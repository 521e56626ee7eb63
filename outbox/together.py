"""Several writes in one statement: rows inserted only when another write of it changed a row.

Where the database allows data-modifying common table expressions
(:attr:`~outboxkit.outbox.dialects.Dialect.writes_in_one_statement`), a store writes a change
and the rows that go with it (its audit trail, its outbox events) as one statement::

    WITH changed AS (UPDATE ... RETURNING ...),
         audit AS (INSERT INTO audit SELECT ... WHERE EXISTS (SELECT 1 FROM changed)),
         events AS (INSERT INTO outbox_events SELECT ... WHERE EXISTS (...))
    SELECT * FROM changed

One statement is one transaction even in autocommit, so the change exists exactly when its
rows do, at one round trip. Each template is built once per shape (its row count and columns);
the values are parameters named ``{prefix}{row}_{column}`` (:func:`row_parameters`).
A statement kept and run again costs neither its building nor SQLAlchemy's cache key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from outboxkit.outbox.dialects import Dialect
from sqlalchemy import (
    ColumnElement,
    Insert,
    Select,
    Update,
    bindparam,
    exists,
    literal,
    select,
    union_all,
)
from sqlalchemy import table as table_clause
from sqlalchemy.sql.selectable import TableClause

ANCHOR = "changed"
"""The name of the change's CTE, which the rows written with it look for."""


def rows_when(
    dialect: Dialect,
    table: TableClause,
    columns: Sequence[str],
    count: int,
    prefix: str,
    fixed: Sequence[tuple[str, ColumnElement[Any]]] = (),
    skip_conflicts: Sequence[str] = (),
) -> Insert:
    """``INSERT`` of ``count`` rows into ``table``, written (in the order given, so their ids
    keep it) only when the statement's change (the CTE :data:`ANCHOR`) returns a row.

    ``columns`` come from parameters ``{prefix}{i}_{column}``, typed as the table's columns;
    ``fixed`` gives the columns every row shares as SQL expressions (the database clock, say);
    with ``skip_conflicts``, a row whose values in those columns exist already is skipped.
    Build it once per shape and keep it: the statement holds no values.
    """
    if count < 1:
        raise ValueError("rows_when writes at least one row")
    selects = [
        select(
            literal(i).label("_position"),
            *(
                bindparam(f"{prefix}{i}_{name}", type_=table.c[name].type).label(name)
                for name in columns
            ),
        )
        for i in range(count)
    ]
    given = selects[0].subquery(prefix) if count == 1 else union_all(*selects).subquery(prefix)
    rows = (
        select(*(given.c[name] for name in columns), *(value for _, value in fixed))
        .where(exists(select(literal(1)).select_from(table_clause(ANCHOR))))
        .order_by(given.c._position)
    )
    statement = dialect.insert(table).from_select([*columns, *(name for name, _ in fixed)], rows)
    if skip_conflicts:
        statement = statement.on_conflict_do_nothing(index_elements=list(skip_conflicts))
    result: Insert = statement
    return result


def one_statement(change: Insert | Update, *writes: Insert) -> Select[Any]:
    """The statement that runs ``change`` (``RETURNING`` its row, as :data:`ANCHOR`) and
    ``writes`` together and returns the changed row."""
    changed = change.cte(ANCHOR)
    ctes = (write.cte(f"w{i}") for i, write in enumerate(writes))
    return select(changed).add_cte(changed, *ctes)  # the change first: the writes read it


def row_parameters(prefix: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of :func:`rows_when`'s statement for ``rows``."""
    return {
        f"{prefix}{i}_{name}": value for i, row in enumerate(rows) for name, value in row.items()
    }


__all__ = ["ANCHOR", "one_statement", "row_parameters", "rows_when"]
