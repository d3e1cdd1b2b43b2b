"""The sensitive tables (schema ``main``): files read, imported as streams, listed.

Files are read by a separate in-memory DuckDB (:func:`open_file`), never by the
store's connection, and imported as a stream of Arrow batches (memory does not
grow with rows). This module is the one writer of the sensitive tables
(:func:`import_table`; :mod:`dpsql.outside` changes rows in its transactions).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from dpsql.domain import quote
from dpsql.errors import ConfigurationError
from dpsql.store import Store, check_identifier

# Rows per Arrow batch streamed into the store: a third of a DuckDB row group, which
# the store still writes whole; a full row group's batch held ~25 MB more at the peak.
IMPORT_BATCH_ROWS = 40_960
#: The store's limits while ``dpsql init`` imports: DuckDB keeps every block it writes
#: cached up to its memory limit (80% of RAM by default), so an import's memory would
#: grow with rows; under the cap it evicts blocks already on disk instead. One thread:
#: a large GROUP BY (the domain check's examples) needs ~40 MB a thread to spill.
IMPORT_LIMITS: dict[str, str | int] = {"memory_limit": "64MB", "threads": 1}


def tables(store: Store, schema: str = "main") -> list[str]:
    """The tables of ``schema``: the sensitive ones unless another is named, by name."""
    rows = store.cursor().execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = ? "
        "ORDER BY table_name", [schema]).fetchall()
    return [r[0] for r in rows]


def table_columns(store: Store, table: str, schema: str = "main") -> dict[str, str]:
    """Column name -> DuckDB type of a table of ``schema`` (empty if it does not exist)."""
    rows = store.cursor().execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
        [schema, table],
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def normalize_name(name: str) -> str:
    """A column name as a lower-case SQL identifier: ``income>50K`` -> ``income_50k``."""
    clean = re.sub(r"[^0-9a-zA-Z]+", "_", name.strip()).strip("_").lower()
    if not clean or clean[0].isdigit():
        clean = "c_" + clean
    return clean


@contextmanager
def open_file(path: str | Path, *, na: str | None = None) -> Iterator[duckdb.DuckDBPyRelation]:
    """The rows of a CSV or Parquet file, as a relation of a private in-memory DuckDB.

    The store's own connection never touches the file system; the relation is
    read lazily (stream it with :func:`batches`), and its DuckDB closes on exit.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigurationError(f"no such file: {path}")
    suffix = "".join(path.suffixes).lower()
    reader = duckdb.connect(":memory:")
    try:
        with _reading(path):
            if suffix.endswith(".parquet"):
                rel = reader.read_parquet(str(path))
            elif suffix.endswith((".csv", ".csv.gz", ".tsv", ".txt")):
                options: dict[str, Any] = {}
                if na is not None:
                    options["na_values"] = [na]
                rel = reader.read_csv(str(path), **options)
            else:
                raise ConfigurationError(f"cannot import {path.name}: use a .csv or .parquet file")
        yield rel
    finally:
        reader.close()


def read_file(path: str | Path, *, na: str | None = None) -> pa.Table:
    """Read a CSV or Parquet file into Arrow (all of it in memory; see :func:`open_file`)."""
    with open_file(path, na=na) as rel, _reading(Path(path)):
        return rel.to_arrow_table()


def batches(rel: duckdb.DuckDBPyRelation) -> pa.RecordBatchReader:
    """Stream ``rel`` as Arrow record batches, so memory holds a few batches, never the file."""
    return rel.to_arrow_reader(IMPORT_BATCH_ROWS)


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turn errors while reading ``path`` into a ConfigurationError.

    A streamed file's reader fails with an OSError (a bad value past the rows
    DuckDB sniffed, when its batch is read).
    """
    try:
        yield
    except (duckdb.Error, OSError) as err:
        raise ConfigurationError(f"cannot read {path}: {str(err).splitlines()[0]}") from err


def import_table(store: Store, name: str, path: str | Path, *, na: str | None = None,
                 normalize: bool = True, replace: bool = False,
                 bounds: Mapping[str, tuple[float, float]] | None = None,
                 prepare: Callable[[duckdb.DuckDBPyConnection, str, Mapping[str, str]],
                                   None] | None = None) -> dict[str, str]:
    """Import a CSV/Parquet file as sensitive table ``name``; returns renamed columns.

    ``prepare(cursor, relation, types)``, when given, may check and change the rows
    (a temporary table) in the import's transaction before they are stored; the
    domain checks of :mod:`dpsql.outside` use it.

    ``bounds`` (column -> declared bounds, from the policy) are enforced: each
    such column of an integer type or DOUBLE gets a CHECK constraint, so the
    table can never hold a value outside its bounds and DP queries need not
    clamp it (:meth:`dpsql.engines.local.DuckDBEngine.enforced_bounds`). A value
    outside its bounds refuses the import. Whether a column is enforced is thus
    the administrator's choice, never a fact about the rows (it shows in query
    times).
    """
    check_identifier(name, "table name")
    path = Path(path)
    with open_file(path, na=na) as rel:
        renames: dict[str, str] = {}
        if normalize:
            names = [normalize_name(c) for c in rel.columns]
            if len(set(names)) != len(names):
                raise ConfigurationError(f"{path}: column names collide once normalized; "
                                         "import with --keep-names")
            renames = {old: new for old, new in zip(rel.columns, names, strict=True)
                       if old != new}
            rel = rel.select(", ".join(f"{quote(old)} AS {quote(new)}"
                                       for old, new in zip(rel.columns, names, strict=True)))
        with store.transaction() as cur:
            if name in tables(store) and not replace:
                raise ConfigurationError(f"table {name!r} already exists; pass --replace "
                                         "to overwrite it")
            _store_rows(cur, name, rel, path, bounds or {}, prepare)
    return renames


def _store_rows(cur: duckdb.DuckDBPyConnection, name: str,
                rel: duckdb.DuckDBPyRelation, path: Path,
                bounds: Mapping[str, tuple[float, float]],
                prepare: Callable[[duckdb.DuckDBPyConnection, str, Mapping[str, str]],
                                  None] | None) -> None:
    """Stream ``rel`` into table ``name``, then check (and ``prepare``) it there.

    The rows go to the store file batch by batch, never all into memory. A table
    with enforced bounds is staged first: DuckDB cannot add a CHECK constraint to
    a table, so the checked rows are copied into one declared with them.
    """
    final = f"main.{quote(name)}"
    rows = "dpsql.import_staged" if set(bounds) & set(rel.columns) else final
    with _reading(path), batches(rel) as stream:
        cur.execute(f"DROP TABLE IF EXISTS {rows}")
        cur.from_arrow(stream.schema.empty_table()).create(rows)
        for batch in stream:  # registering each batch instead would keep them all alive
            cur.from_arrow(batch).insert_into(rows)
    source = cur.sql(f"SELECT * FROM {rows}")
    types = {c: str(t) for c, t in zip(source.columns, source.types, strict=True)}
    if prepare is not None:
        prepare(cur, rows, types)
    checks = _enforced_checks(cur, rows, types, bounds, path)
    if rows != final:
        columns = ", ".join(
            f"{quote(c)} {t}" + (f" CHECK ({checks[c]})" if c in checks else "")
            for c, t in types.items())
        cur.execute(f"CREATE OR REPLACE TABLE {final} ({columns})")
        cur.execute(f"INSERT INTO {final} SELECT * FROM {rows}")
        cur.execute(f"DROP TABLE {rows}")


#: Column types whose values a CHECK (col BETWEEN lo AND hi) bounds exactly (NaN and
#: infinities fail it). FLOAT compares in single precision, wide decimals and HUGEINT
#: are read through casts: those are always clamped instead.
BOUNDABLE_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT",
                   "UINTEGER", "DOUBLE")


def _enforced_checks(cur: duckdb.DuckDBPyConnection, relation: str, types: Mapping[str, str],
                     bounds: Mapping[str, tuple[float, float]], source: str | Path
                     ) -> dict[str, str]:
    """CHECK expressions for the bounded columns of ``relation`` (all must fit)."""
    candidates = {c: b for c, b in bounds.items() if types.get(c, "").upper() in BOUNDABLE_TYPES}
    if not candidates:
        return {}
    checks = {c: f"{quote(c)} BETWEEN {_bound_literal(lo)} AND {_bound_literal(hi)}"
              for c, (lo, hi) in candidates.items()}
    fits = cur.execute("SELECT " + ", ".join(
        f"coalesce(bool_and({quote(c)} IS NULL OR {check}), TRUE)"
        for c, check in checks.items()) + f" FROM {relation}").fetchone()
    assert fits is not None
    outside = [c for c, ok in zip(checks, fits, strict=True) if not ok]
    if outside:
        raise ConfigurationError(
            f"{source}: column(s) {', '.join(outside)} hold values outside their policy "
            "bounds, which cannot be enforced; widen the bounds, or import without "
            "enforcing them (every query then clamps the values)")
    return checks


def _bound_literal(value: float) -> str:
    """A bound as an exact SQL literal (integers in full, so a BIGINT compares exactly)."""
    number = float(value)
    if not math.isfinite(number):
        raise ConfigurationError(f"bound {value} is not finite")
    return str(int(number)) if number.is_integer() else repr(number)
