"""PostgresEngine: the engine of a dataset whose rows live in a PostgreSQL table.

One statement is one read-only REPEATABLE READ transaction on its own
connection: the column types, the constraints and the aggregation all read the
same snapshot. The SQL is dpsql's plan rendered in sqlglot's postgres dialect
(after :func:`to_postgres` rewrites the few functions whose meaning differs),
never the analyst's text. A cancel (statement timeout or user request) reaches
the server through libpq's cancel request. The credentials come from the
environment and appear in no message: a connection that fails says only which
dataset's engine could not be reached.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

import psycopg
import pyarrow as pa
import sqlglot
from psycopg import errors as pg_errors
from psycopg.conninfo import make_conninfo
from sqlglot import exp

from dpsql.engine_spec import EngineSpec
from dpsql.engines.base import EngineError, Links, intersected, number, unwrap
from dpsql.engines.interrupt import Interrupter
from dpsql.errors import ConfigurationError, QueryCanceled

log = logging.getLogger(__name__)
CONNECT_TIMEOUT = 10  # seconds before an unreachable server is reported

#: information_schema.columns.data_type -> the DuckDB name the planner knows.
_TYPES = {
    "smallint": "SMALLINT", "integer": "INTEGER", "bigint": "BIGINT", "real": "FLOAT",
    "double precision": "DOUBLE", "text": "VARCHAR", "character varying": "VARCHAR",
    "boolean": "BOOLEAN", "date": "DATE", "timestamp without time zone": "TIMESTAMP",
    "timestamp with time zone": "TIMESTAMP WITH TIME ZONE",
}
#: result column type oid -> Arrow type (an empty result keeps its types).
_ARROW = {16: pa.bool_(), 20: pa.int64(), 21: pa.int16(), 23: pa.int32(), 25: pa.string(),
          700: pa.float32(), 701: pa.float64(), 1043: pa.string(), 1082: pa.date32()}


def conninfo(spec: EngineSpec) -> str:
    """The connection string of ``spec``, read from the environment (never stored)."""
    name = spec.dsn_env or spec.password_env
    if name is not None and name not in os.environ:
        raise ConfigurationError(f"the environment variable {name} is not set; the dataset's "
                                 "engine needs it to connect")
    if spec.dsn_env is not None:
        return os.environ[spec.dsn_env]
    password = os.environ[spec.password_env] if spec.password_env else None
    return make_conninfo(spec.dsn or "", password=password) if password else spec.dsn or ""


class _Cancel:
    """What :class:`Interrupter` interrupts: libpq's cancel request for the connection."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection

    def interrupt(self) -> None:
        with contextlib.suppress(psycopg.Error):  # the query may have ended meanwhile
            self._connection.cancel_safe(timeout=CONNECT_TIMEOUT)


class _PostgresPrepared:
    """A server-side prepared statement of the snapshot's connection, run once."""

    def __init__(self, engine: PostgresEngine, name: str, text: str) -> None:
        self._engine = engine
        self._name = name
        self.text = text

    def run(self) -> pa.Table:
        with self._engine.querying() as cursor:
            cursor.execute(f"EXECUTE {self._name}")
            return _arrow(cursor)


def _arrow(cursor: psycopg.Cursor[Any]) -> pa.Table:
    """The result as an Arrow table, typed from the result's description."""
    description = cursor.description or []
    rows = cursor.fetchall()
    return pa.table({column.name: pa.array([row[i] for row in rows],
                                           _ARROW.get(column.type_code))
                     for i, column in enumerate(description)})


class PostgresEngine:
    """Runs one statement's queries on a PostgreSQL table, in one read-only snapshot."""

    dialect = "postgres"

    def __init__(self, spec: EngineSpec, interrupts: Interrupter | None = None,
                 links: Links | None = None) -> None:
        self.spec = spec
        self.interrupts = interrupts or Interrupter()
        self._links = links
        self._connection: psycopg.Connection[Any] | None = None
        self._prepared = 0

    def _snapshot(self) -> psycopg.Connection[Any]:
        """The statement's connection; its transaction begins with the first query.

        A connection the session kept is used if it still answers (a server that
        restarted meanwhile broke it: a new one is opened instead).
        """
        if self._connection is None:
            key = conninfo(self.spec)
            kept = self._links.take(key) if self._links is not None else None
            if kept is not None:
                with contextlib.suppress(EngineError):
                    return self._begin(kept)
                kept.close()
            try:
                connection = psycopg.connect(key, connect_timeout=CONNECT_TIMEOUT,
                                             application_name="dpsql")
            except psycopg.Error as err:
                log.warning("cannot connect to the engine of table %s: %s", self.spec.table,
                            str(err).splitlines()[0] if str(err) else type(err).__name__)
                raise EngineError(f"cannot connect to the PostgreSQL server holding "
                                  f"{self.spec.table}") from None
            connection.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            connection.read_only = True
            return self._begin(connection)
        return self._connection

    def _begin(self, connection: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        """Begin the statement's transaction on ``connection``, as every engine writes texts."""
        self._connection = connection
        try:
            with self.querying() as cursor:  # the texts every engine writes alike
                cursor.execute("SET LOCAL DateStyle = 'ISO, YMD'; "
                               "SET LOCAL extra_float_digits = 1")
        except EngineError:
            self._connection = None
            raise
        return connection

    @contextmanager
    def querying(self, name: str | None = None) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor of the snapshot that the interrupter can cancel; errors become EngineError.

        ``name``: a server-side cursor of that name, whose rows arrive as fetched.
        """
        connection = self._snapshot()
        try:
            with self.interrupts.running(_Cancel(connection)), \
                    connection.cursor(name=name) if name else connection.cursor() as cursor:
                yield cursor
        except pg_errors.QueryCanceled:
            raise QueryCanceled() from None
        except psycopg.Error as err:
            raise EngineError(str(err).splitlines()[0] if str(err) else type(err).__name__) \
                from err

    def close(self) -> None:
        """End the snapshot (read only: nothing to commit); keep the connection for the session.

        Its prepared statements are dropped first, so the next statement starts clean.
        """
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            connection.rollback()
            if self._links is not None:
                connection.execute("DEALLOCATE ALL")
                connection.rollback()
        except psycopg.Error:
            connection.close()
            return
        if self._links is None:
            connection.close()
        else:
            self._links.give(conninfo(self.spec), connection)

    def render(self, query: exp.Expr) -> str:
        """The query as PostgreSQL SQL."""
        return to_postgres(query).sql(dialect=self.dialect)

    def prepare(self, query: exp.Expr, text: str | None = None) -> _PostgresPrepared:
        """PREPARE the query on the server: names and types bind, no row is read."""
        text = text if text is not None else self.render(query)
        self._prepared += 1
        name = f"dpsql_{self._prepared}"
        with self.querying() as cursor:
            cursor.execute(f"PREPARE {name} AS {text}")
        return _PostgresPrepared(self, name, text)

    def execute(self, query: exp.Expr) -> pa.Table:
        """Bind and run ``query``."""
        return self.prepare(query).run()

    def stream(self, query: exp.Expr, schema: pa.Schema, size: int = 1 << 16
               ) -> Iterator[pa.RecordBatch]:
        """``query``'s rows as Arrow batches of at most ``size`` rows, in ``schema``.

        A server-side cursor sends ``size`` rows per round trip, so memory here does
        not grow with the table (a release exports its bounded source this way).
        """
        with self.querying(name="dpsql_stream") as cursor:
            cursor.execute(self.render(query))
            while rows := cursor.fetchmany(size):
                columns = zip(*rows, strict=True)  # rows -> columns
                yield pa.record_batch([pa.array(column, type=field.type) for column, field
                                       in zip(columns, schema, strict=True)], schema=schema)

    def column_types(self, table: str) -> dict[str, str]:
        """Column name -> type (DuckDB's name for it) of the engine's table, from the catalog.

        ``table``: the dataset's table name in the policy; the engine reads the
        table its spec names.
        """
        with self.querying() as cursor:
            cursor.execute(
                "SELECT column_name, data_type, numeric_precision, numeric_scale "
                "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                "ORDER BY ordinal_position", (self.spec.schema_name, self.spec.table_name))
            rows = cursor.fetchall()
        if not rows:
            raise EngineError(f"no table {self.spec.table} on the PostgreSQL server")
        return {name: _duckdb_type(kind, precision, scale)
                for name, kind, precision, scale in rows}

    def enforced_bounds(self, table: str) -> dict[str, tuple[Fraction, Fraction]]:
        """Bounds from validated ``CHECK (col >= lo AND col <= hi)`` constraints (or BETWEEN).

        PostgreSQL checks them on every insert and update, and NaN and infinities
        fail them; any other form of CHECK is ignored (the column is then clamped).
        """
        with self.querying() as cursor:
            cursor.execute(
                "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c "
                "JOIN pg_class t ON t.oid = c.conrelid "
                "JOIN pg_namespace n ON n.oid = t.relnamespace "
                "WHERE n.nspname = %s AND t.relname = %s AND c.contype = 'c' "
                "AND c.convalidated", (self.spec.schema_name, self.spec.table_name))
            rows = cursor.fetchall()
        return intersected(range_check(definition) for (definition,) in rows)


def _duckdb_type(kind: str, precision: int | None, scale: int | None) -> str:
    if kind == "numeric":  # unconstrained NUMERIC has no precision: read as DOUBLE
        return f"DECIMAL({precision},{scale})" if precision is not None else "NUMERIC"
    return _TYPES.get(kind, kind.upper())


def range_check(definition: str) -> tuple[str, Fraction, Fraction] | None:
    """``CHECK ((col >= lo) AND (col <= hi))`` or ``CHECK (col BETWEEN lo AND hi)`` -> bounds."""
    text = definition.strip()
    if not text.upper().startswith("CHECK"):
        return None
    try:
        node = sqlglot.parse_one(text[len("CHECK"):], read="postgres")
    except sqlglot.errors.SqlglotError:
        return None
    node = unwrap(node)
    if isinstance(node, exp.Between):
        column, lo, hi = node.this, _value(node.args.get("low")), _value(node.args.get("high"))
        if not isinstance(column, exp.Column) or column.table or lo is None or hi is None:
            return None
        return column.name, lo, hi
    if not isinstance(node, exp.And):
        return None
    sides = [_side(unwrap(node.this)), _side(unwrap(node.expression))]
    if None in sides:
        return None
    (name_a, kind_a, a), (name_b, kind_b, b) = sides  # type: ignore[misc]
    if name_a != name_b or {kind_a, kind_b} != {"lo", "hi"}:
        return None
    return (name_a, a, b) if kind_a == "lo" else (name_a, b, a)


def _side(node: exp.Expr) -> tuple[str, str, Fraction] | None:
    """``col >= v`` -> (col, 'lo', v); ``col <= v`` -> (col, 'hi', v); else None."""
    if not isinstance(node, (exp.GTE, exp.LTE)):
        return None
    column, value = unwrap(node.this), _value(node.expression)
    if not isinstance(column, exp.Column) or column.table or value is None:
        return None
    return column.name, "lo" if isinstance(node, exp.GTE) else "hi", value


def _value(node: exp.Expr | None) -> Fraction | None:
    """The exact value of a bound as PostgreSQL writes it: a number, maybe cast.

    ``'-1.5'::numeric``, ``(2)::double precision``: a cast to DOUBLE is the
    nearest double (as PostgreSQL computes it), to an integer or unscaled NUMERIC
    only when nothing is rounded; any other cast is not read.
    """
    node = unwrap(node) if node is not None else None
    if not isinstance(node, exp.Cast):
        return number(node)
    inner = node.this
    value = (_string_number(inner.this) if isinstance(inner, exp.Literal) and inner.is_string
             else _value(inner))
    target = node.to
    if value is None:
        return None
    if target.is_type(exp.DataType.Type.DOUBLE):
        return Fraction(float(value))
    if target.is_type(*exp.DataType.INTEGER_TYPES) and value.denominator == 1:
        return value
    if target.is_type(exp.DataType.Type.DECIMAL) and not target.expressions:
        return value
    return None


def _string_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        return None


def to_postgres(query: exp.Expr) -> exp.Expr:
    r"""The plan with DuckDB functions PostgreSQL lacks or reads differently rewritten.

    ``isnan(x)`` is ``x = 'NaN'`` (NaN equals itself in PostgreSQL's ordering);
    ``round(x)`` rounds half away from zero as DuckDB's does (PostgreSQL's float
    ``round`` rounds half to even). sqlglot itself writes ``round(x, n)`` as the
    NUMERIC round of ``x`` (PostgreSQL has no float ``round(x, n)``), which can
    differ from DuckDB's in the last digit when ``x`` is a double just below a tie.
    A LIKE without ESCAPE gets ``ESCAPE ''``: DuckDB's has no escape character, and
    PostgreSQL's default one (backslash) would both read ``\%`` otherwise and
    raise, on the rows that reach it, for a pattern ending in it.
    """
    def operands(like: exp.Expr) -> exp.Expr:  # a replaced node's children are not visited
        out = like.copy()
        for key in ("this", "expression"):
            if isinstance(out.args.get(key), exp.Expr):
                out.set(key, out.args[key].transform(rewrite))
        return out

    def rewrite(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Escape):  # its own escape character, as written
            like = node.this
            inner = operands(like) if isinstance(like, (exp.Like, exp.ILike)) \
                else like.transform(rewrite)
            return exp.Escape(this=inner, expression=node.expression.copy())
        if isinstance(node, (exp.Like, exp.ILike)):
            return exp.Escape(this=operands(node), expression=exp.Literal.string(""))
        if isinstance(node, exp.IsNan):
            return exp.EQ(this=node.this, expression=_nan())
        if isinstance(node, exp.Round) and node.args.get("decimals") is None:
            value = node.this.transform(rewrite)  # a replaced node's children are not visited
            half = exp.Add(this=exp.Abs(this=value.copy()), expression=exp.Literal.number(0.5))
            return exp.Mul(this=exp.Sign(this=value.copy()), expression=exp.Floor(this=half))
        return node

    return query.copy().transform(rewrite, copy=False)


def _nan() -> exp.Expr:
    return exp.cast(exp.Literal.string("NaN"), "DOUBLE")
