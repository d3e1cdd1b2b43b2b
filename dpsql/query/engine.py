"""The only place that knows which database runs a query: an AST in, Arrow out.

Plans are sqlglot ASTs; :class:`DuckDBEngine` renders them in the DuckDB dialect
and runs them on the store's hardened connection. Another engine (a
distributed one) would implement the same two methods; noise, accounting and
the ledger stay in dpsql whatever runs the aggregation.
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


class Engine(Protocol):
    """Runs dpsql-generated queries."""

    def check(self, query: exp.Expr) -> None:
        """Bind and plan ``query`` without reading data; raise EngineError if it cannot run."""

    def execute(self, query: exp.Expr) -> pa.Table:
        """Run ``query`` and return its result."""

    def column_types(self, table: str) -> dict[str, str]:
        """Column name -> database type of a sensitive table (schema only, no rows)."""


class DuckDBEngine:
    """Runs queries on a store's hardened DuckDB connection (one cursor per call)."""

    dialect = "duckdb"

    def __init__(self, store: Store) -> None:
        self.store = store

    def render(self, query: exp.Expr) -> str:
        return query.sql(dialect=self.dialect)

    def check(self, query: exp.Expr) -> None:
        self._run("EXPLAIN " + self.render(query), fetch=False)

    def execute(self, query: exp.Expr) -> pa.Table:
        table = self._run(self.render(query), fetch=True)
        assert table is not None
        return table

    def column_types(self, table: str) -> dict[str, str]:
        cursor = self.store.analyst_cursor()
        try:
            relation = cursor.sql(f"SELECT * FROM main.{quote(table)}")
            return {name: str(kind) for name, kind in zip(relation.columns, relation.types,
                                                          strict=True)}
        except duckdb.Error as err:
            raise EngineError(str(err).splitlines()[0]) from err
        finally:
            cursor.close()

    def _run(self, sql: str, *, fetch: bool) -> pa.Table | None:
        cursor = self.store.analyst_cursor()
        try:
            if fetch:
                return cursor.sql(sql).to_arrow_table()
            cursor.execute(sql)
            return None
        except duckdb.Error as err:
            raise EngineError(str(err).splitlines()[0]) from err
        finally:
            cursor.close()
