"""The only place that knows which database runs a query: an AST in, Arrow out.

Plans are sqlglot ASTs; :class:`DuckDBEngine` renders them in the DuckDB dialect
and runs them on the store's hardened connection. ``prepare`` binds a query
(names, types, functions) without reading a row, so a query that cannot run is
found before the ledger charges; the prepared query then runs after the charge.
Another engine (a distributed one) would implement the same methods; noise,
accounting and the ledger stay in dpsql whatever runs the aggregation.
"""

from __future__ import annotations

from typing import Protocol

import duckdb
import pyarrow as pa
from sqlglot import exp

from dpsql.domain import quote
from dpsql.store import Store


class EngineError(Exception):
    """The engine could not run a query; ``message`` is the database's first line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Prepared(Protocol):
    """A bound query, ready to run."""

    def run(self) -> pa.Table:
        """Run the query and return its result (once)."""

    def close(self) -> None:
        """Release the query without running it."""


class Engine(Protocol):
    """Runs dpsql-generated queries."""

    def prepare(self, query: exp.Expr) -> Prepared:
        """Bind ``query`` without reading data; raise EngineError if it cannot run."""

    def execute(self, query: exp.Expr) -> pa.Table:
        """Bind and run ``query`` and return its result."""

    def column_types(self, table: str) -> dict[str, str]:
        """Column name -> database type of a sensitive table (schema only, no rows)."""


class _DuckDBPrepared:
    def __init__(self, cursor: duckdb.DuckDBPyConnection,
                 relation: duckdb.DuckDBPyRelation) -> None:
        self._cursor = cursor
        self._relation = relation

    def run(self) -> pa.Table:
        try:
            return self._relation.to_arrow_table()
        except duckdb.Error as err:
            raise EngineError(str(err).splitlines()[0]) from err
        finally:
            self._cursor.close()

    def close(self) -> None:
        self._cursor.close()


class DuckDBEngine:
    """Runs queries on a store's hardened DuckDB connection (one cursor per query)."""

    dialect = "duckdb"

    def __init__(self, store: Store) -> None:
        self.store = store

    def render(self, query: exp.Expr) -> str:
        """The query as DuckDB SQL."""
        return query.sql(dialect=self.dialect)

    def prepare(self, query: exp.Expr) -> Prepared:
        """Bind the query (a DuckDB relation is lazy: nothing runs until ``run``)."""
        cursor = self.store.analyst_cursor()
        try:
            return _DuckDBPrepared(cursor, cursor.sql(self.render(query)))
        except duckdb.Error as err:
            cursor.close()
            raise EngineError(str(err).splitlines()[0]) from err

    def execute(self, query: exp.Expr) -> pa.Table:
        """Bind and run ``query``."""
        return self.prepare(query).run()

    def column_types(self, table: str) -> dict[str, str]:
        """Column name -> DuckDB type, from binding ``SELECT *`` (no rows are read)."""
        cursor = self.store.analyst_cursor()
        try:
            relation = cursor.sql(f"SELECT * FROM main.{quote(table)}")
            return {name: str(kind) for name, kind in zip(relation.columns, relation.types,
                                                          strict=True)}
        except duckdb.Error as err:
            raise EngineError(str(err).splitlines()[0]) from err
        finally:
            cursor.close()
