"""The store's own DuckDB as an engine: one statement's queries in one snapshot.

:class:`DuckDBEngine` renders plans in the DuckDB dialect and runs them on the
store's hardened connection. One engine serves one statement and reads
everything (column types, constraints, the aggregation) in one snapshot, so the
SQL runs on the schema it was generated for, whatever an administrator changes
meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction

import duckdb
import pyarrow as pa
from sqlglot import exp

from dpsql.domain import quote
from dpsql.engines.base import EngineError, Prepared, between_bounds, intersected
from dpsql.engines.interrupt import Interrupter
from dpsql.store import Store


class _DuckDBPrepared:
    """A bound query (``relation``), or one that bound before and binds again as it runs.

    ``one_row``: a global aggregate of BIGINT measures (no GROUP BY, no quantile's
    histogram). Its one row is
    fetched as a tuple and made into Arrow here, which is about a millisecond
    cheaper than DuckDB's Arrow export of a tiny result.
    """

    def __init__(self, cursor: duckdb.DuckDBPyConnection, interrupts: Interrupter,
                 relation: duckdb.DuckDBPyRelation | None = None, text: str = "",
                 one_row: bool = False) -> None:
        self._cursor = cursor
        self._interrupts = interrupts
        self._relation = relation
        self.text = text
        self._one_row = one_row

    def run(self) -> pa.Table:
        with _querying(self._interrupts, self._cursor) as cursor:
            if self._one_row:
                return _bigint_table(cursor.execute(self.text))
            relation = self._relation if self._relation is not None else cursor.sql(self.text)
            return relation.to_arrow_table()


@contextmanager
def _querying(interrupts: Interrupter,
              cursor: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """DuckDB work on ``cursor`` that ``interrupts`` can stop; its errors become EngineError."""
    try:
        with interrupts.running(cursor):
            yield cursor
    except duckdb.Error as err:
        raise EngineError(str(err).splitlines()[0]) from err


def _bigint_table(result: duckdb.DuckDBPyConnection) -> pa.Table:
    """A result whose columns are all BIGINT, as an Arrow table of int64 columns."""
    description = result.description or []
    if any(str(column[1]) != "BIGINT" for column in description):
        raise EngineError("a global aggregate returned a column that is not BIGINT")
    rows = result.fetchall()
    return pa.table({column[0]: pa.array([row[i] for row in rows], pa.int64())
                     for i, column in enumerate(description)})


class DuckDBEngine:
    """Runs one statement's queries on a store's hardened connection, in one snapshot."""

    dialect = "duckdb"

    def __init__(self, store: Store, interrupts: Interrupter | None = None) -> None:
        self.store = store
        self.interrupts = interrupts or Interrupter()
        self._cursor: duckdb.DuckDBPyConnection | None = None

    def _snapshot(self) -> duckdb.DuckDBPyConnection:
        """The statement's cursor, inside a transaction begun on first use."""
        if self._cursor is None:
            cursor = self.store.cursor()
            cursor.execute("BEGIN TRANSACTION")
            self._cursor = cursor
        return self._cursor

    def close(self) -> None:
        """End the statement's snapshot (read only: nothing to commit)."""
        cursor, self._cursor = self._cursor, None
        if cursor is not None:
            _end(cursor)

    def render(self, query: exp.Expr) -> str:
        """The query as DuckDB SQL."""
        return query.sql(dialect=self.dialect)

    def prepare(self, query: exp.Expr, text: str | None = None) -> Prepared:
        """Bind the query (a DuckDB relation is lazy: nothing runs until ``run``)."""
        cursor = self._snapshot()
        one_row = isinstance(query, exp.Select) and query.args.get("group") is None \
            and not any(f.name.lower() == "histogram" for f in query.find_all(exp.Anonymous))
        if text is not None:
            return _DuckDBPrepared(cursor, self.interrupts, text=text, one_row=one_row)
        text = self.render(query)
        with _querying(self.interrupts, cursor):
            return _DuckDBPrepared(cursor, self.interrupts, cursor.sql(text), text, one_row)

    def execute(self, query: exp.Expr) -> pa.Table:
        """Bind and run ``query`` (not remembered: for one-off queries)."""
        cursor = self._snapshot()
        with _querying(self.interrupts, cursor):
            relation = cursor.sql(self.render(query))
        return _DuckDBPrepared(cursor, self.interrupts, relation).run()

    def enforced_bounds(self, table: str) -> dict[str, tuple[Fraction, Fraction]]:
        """Bounds from the table's ``CHECK (col BETWEEN lo AND hi)`` constraints.

        DuckDB checks them on every insert and update, and NaN and infinities fail
        them, so a column listed here never holds a value outside its range. Any
        other form of CHECK is ignored (the column is then clamped as usual).
        """
        with _querying(self.interrupts, self._snapshot()) as cursor:
            rows = cursor.execute(
                "SELECT expression FROM duckdb_constraints() WHERE database_name = "
                "current_database() AND schema_name = 'main' AND table_name = ? "
                "AND constraint_type = 'CHECK'", [table]).fetchall()
        return intersected(between_bounds(expression) for (expression,) in rows)

    def stream(self, query: exp.Expr, schema: pa.Schema, size: int = 1 << 16
               ) -> Iterator[pa.RecordBatch]:
        """``query``'s rows as Arrow batches of at most ``size`` rows (``schema``: their types)."""
        with _querying(self.interrupts, self._snapshot()) as cursor:
            yield from cursor.sql(self.render(query)).to_arrow_reader(size)

    def column_types(self, table: str) -> dict[str, str]:
        """Column name -> DuckDB type, from binding ``SELECT *`` (no rows are read)."""
        with _querying(self.interrupts, self._snapshot()) as cursor:
            relation = cursor.sql(f"SELECT * FROM main.{quote(table)}")
            return {name: str(kind) for name, kind in zip(relation.columns, relation.types,
                                                          strict=True)}


def _end(cursor: duckdb.DuckDBPyConnection) -> None:
    """Roll back and close a statement's cursor."""
    with contextlib.suppress(duckdb.Error):  # an aborted transaction is over already
        cursor.execute("ROLLBACK")
    cursor.close()
