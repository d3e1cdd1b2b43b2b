"""The only place that knows which database runs a query: an AST in, Arrow out.

Plans are sqlglot ASTs; :class:`DuckDBEngine` renders them in the DuckDB dialect
and runs them on the store's hardened connection. ``prepare`` binds a query
(names, types, functions) without reading a row, so a plan whose SQL cannot
bind is found before the ledger charges it; the prepared query runs after the
charge.
One engine serves one statement and reads everything (column types,
constraints, the aggregation) in one snapshot, so the SQL runs on the schema it
was generated for, whatever an administrator changes meanwhile.
:func:`engine_for` picks a dataset's engine: :class:`DuckDBEngine` for the
store's own tables, :class:`~dpsql.query.postgres.PostgresEngine` for a dataset
whose policy names ``engine: {kind: postgres}`` and
:class:`~dpsql.query.spark.SparkEngine` for ``engine: {kind: spark}``
(docs/engines.md); another engine implements the same methods and is added
there. Noise, accounting and the ledger stay in dpsql whatever runs the aggregation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from functools import lru_cache
from typing import Any, Protocol

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

from dpsql.domain import quote
from dpsql.errors import ConfigurationError
from dpsql.interrupt import Interrupter
from dpsql.policy import Dataset
from dpsql.store import Store


class EngineError(Exception):
    """The engine could not run a query; ``message`` is the database's first line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Prepared(Protocol):
    """A bound query, ready to run; ``text``: its rendering."""

    text: str

    def run(self) -> pa.Table:
        """Run the query and return its result (once)."""


class Engine(Protocol):
    """Runs dpsql-generated queries."""

    def prepare(self, query: exp.Expr, text: str | None = None) -> Prepared:
        """Bind ``query`` without reading data; raise EngineError if it cannot run.

        ``text``: its rendering, which bound before on this store's schema (the
        caller checked the schema is the same): it then binds as it runs.
        """

    def execute(self, query: exp.Expr) -> pa.Table:
        """Bind and run ``query`` and return its result."""

    def stream(self, query: exp.Expr, schema: pa.Schema, size: int = 1 << 16
               ) -> Iterator[pa.RecordBatch]:
        """``query``'s rows in Arrow batches of at most ``size`` rows, never all at once.

        For a release's bounded source, which may not fit in memory.
        """

    def column_types(self, table: str) -> dict[str, str]:
        """Column name -> database type of a sensitive table (schema only, no rows)."""

    def enforced_bounds(self, table: str) -> dict[str, tuple[Fraction, Fraction]]:
        """Column -> [lo, hi] that the database itself keeps every non-NULL value in.

        Schema facts only (constraints), never read from the rows; an engine that
        cannot tell returns {} and every value is clamped.
        """

    def close(self) -> None:
        """End the statement: release the snapshot (nothing was written)."""


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


class Links:
    """A session's open connections to other engines, kept between its statements.

    A statement takes the connection it needs and gives it back when it ends, so
    two statements never share one (a second at the same time opens its own), and
    no lock is needed. Opening a PostgreSQL connection (a SCRAM login) costs tens
    of milliseconds, more than a small query; ``benchmarks/engines.py`` measures it.
    """

    def __init__(self) -> None:
        self._idle: dict[str, Any] = {}

    def take(self, key: str) -> Any | None:
        """An idle connection opened with ``key``, now the caller's; or None."""
        return self._idle.pop(key, None)

    def give(self, key: str, connection: Any) -> None:
        """Keep ``connection`` for the next statement (closing one already kept)."""
        other = self._idle.pop(key, None)
        self._idle[key] = connection
        if other is not None:
            other.close()

    def close(self) -> None:
        """Close every kept connection (the session ends)."""
        while self._idle:
            self._idle.popitem()[1].close()


def engine_for(dataset: Dataset, store: Store, interrupts: Interrupter,
               links: Links | None = None) -> Engine:
    """The engine that holds ``dataset``'s rows, for one statement (close it after).

    ``links``: the session's kept connections, reused and given back at close.
    """
    if dataset.engine is None:
        return DuckDBEngine(store, interrupts)
    if dataset.engine.kind == "spark":
        try:
            from dpsql.query.spark import SparkEngine  # pyspark only where it is used
        except ImportError as err:
            raise ConfigurationError(f"dataset {dataset.name} lives in Spark, which needs "
                                     "pyspark: pip install 'dpsql[spark]'") from err
        return SparkEngine(dataset.engine, interrupts)
    try:
        from dpsql.query.postgres import PostgresEngine  # psycopg only where it is used
    except ImportError as err:
        raise ConfigurationError(f"dataset {dataset.name} lives in PostgreSQL, which needs "
                                 "psycopg: pip install 'dpsql[postgres]'") from err
    return PostgresEngine(dataset.engine, interrupts, links)


def intersected(ranges: Iterable[tuple[str, Fraction, Fraction] | None]
                ) -> dict[str, tuple[Fraction, Fraction]]:
    """Column -> [lo, hi] from the range checks found (None: a check of another form).

    Several checks of one column all hold, so their intersection does.
    """
    out: dict[str, tuple[Fraction, Fraction]] = {}
    for found in ranges:
        if found is None:
            continue
        column, lo, hi = found
        if column in out:
            lo, hi = max(lo, out[column][0]), min(hi, out[column][1])
        out[column] = (lo, hi)
    return out


def _end(cursor: duckdb.DuckDBPyConnection) -> None:
    """Roll back and close a statement's cursor."""
    with contextlib.suppress(duckdb.Error):  # an aborted transaction is over already
        cursor.execute("ROLLBACK")
    cursor.close()


@lru_cache(maxsize=256)
def between_bounds(expression: str) -> tuple[str, Fraction, Fraction] | None:
    """``(col BETWEEN lo AND hi)`` with numeric literals -> (col, lo, hi); else None."""
    try:
        node = sqlglot.parse_one(expression, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return None
    while isinstance(node, exp.Paren):
        node = node.this
    if not isinstance(node, exp.Between) or not isinstance(node.this, exp.Column) \
            or node.this.table:
        return None
    lo, hi = number(node.args.get("low")), number(node.args.get("high"))
    if lo is None or hi is None:
        return None
    return node.this.name, lo, hi


def number(node: exp.Expr | None) -> Fraction | None:
    """The exact value of a numeric literal (possibly negated or parenthesized).

    Casts are not read through: a cast can round (CAST(2.7 AS INTEGER) is 3).
    """
    sign = 1
    while isinstance(node, (exp.Paren, exp.Neg)):
        if isinstance(node, exp.Neg):
            sign = -sign
        node = node.this
    if not isinstance(node, exp.Literal) or node.is_string:
        return None
    try:
        value = Fraction(node.this)
    except (ValueError, ZeroDivisionError):
        return None
    return sign * value
