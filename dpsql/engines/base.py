"""What every engine is: the protocol, its error, kept links, and SQL facts engines share.

An engine is the only place that knows which database runs a query: a sqlglot
AST in, Arrow out (:mod:`dpsql.engines.local` runs it on the store's own DuckDB,
:mod:`dpsql.engines.postgres` on PostgreSQL, :mod:`dpsql.engines.spark` on
Spark). ``prepare`` binds a query (names, types, functions) without reading a
row, so a plan whose SQL cannot bind is found before the ledger charges it; the
prepared query runs after the charge. Noise, accounting and the ledger stay in
dpsql whatever runs the aggregation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from fractions import Fraction
from functools import lru_cache
from typing import Any, Protocol

import pyarrow as pa
import sqlglot
from sqlglot import exp


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


def unwrap(node: exp.Expr) -> exp.Expr:
    """``node`` without the parentheses around it."""
    while isinstance(node, exp.Paren):
        node = node.this
    return node
