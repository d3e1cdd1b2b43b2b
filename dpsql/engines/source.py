"""The bounded source: a dataset's rows after contribution bounding, as SQL.

Privacy: each privacy unit keeps at most ``max_rows`` rows, chosen by a keyed
hash of the row's *values* (never its physical position), seeded with the
store's secret so the choice is fixed per store and cannot be steered by the
analyst. Removing one unit leaves every other unit's rows,
hence their hashes and their choice, unchanged, so a count over the result has
sensitivity ``max_rows`` under add/remove of one unit. Without a privacy unit
each row is its own unit and nothing is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping

import duckdb

from dpsql.domain import quote, sql_literal
from dpsql.policy import Dataset
from dpsql.store import Store, check_identifier

_FLOATS = ("DOUBLE", "FLOAT", "REAL", "FLOAT4", "FLOAT8")


def row_key_sql(dataset: Dataset, secret: str,
                types: Mapping[str, str] | None = None) -> str:
    """SQL for a row's choice key, seeded with the secret, over the row's values.

    The values are every column the policy declares (hidden ones and the privacy
    unit included), in column-name order, so rows with equal keys are equal in
    every declared column (up to a collision) and whichever of them is kept,
    every query sees the same rows. The choice is a function of the unit's own
    rows, which is all the sensitivity bound needs; the secret keeps it from
    being steered by the analyst.

    A dataset in the store uses DuckDB's ``hash`` (it treats ``-0.0`` as ``0.0``,
    all NaNs alike and NULL apart from every value): it costs what the old
    ``rowid`` hash did. A dataset on another engine uses :func:`portable_key_sql`,
    which DuckDB, PostgreSQL and Spark compute alike (docs/engines.md measures both).
    A DuckDB version whose ``hash`` changed would change the choice, never the bound.
    """
    if dataset.engine is not None:
        return portable_key_sql(dataset, secret, types or {})
    values = ", ".join(quote(name) for name in sorted(dataset.columns))
    return f"hash({sql_literal(secret)}, {values})"


def portable_key_sql(dataset: Dataset, secret: str, types: Mapping[str, str]) -> str:
    """``md5`` of the secret and a canonical text of the row, as text in byte order.

    Each value is written as ``v<length>:<text>`` (NULL as ``n``), so no two rows
    share a text unless they share every value. The text of a value is the same in
    DuckDB and PostgreSQL (ISO dates, UTF-8): floats are the one type whose casts
    differ (``1.0`` vs ``1``, ``nan`` vs ``NaN``), so integral floats are written
    as integers and NaN and infinities by name. ``types``: the table's column
    types (DuckDB's names).
    """
    parts = []
    for name in sorted(dataset.columns):
        text = _canonical_text(quote(name), types.get(name, "").upper())
        parts.append(f"coalesce('v' || CAST(length({text}) AS TEXT) || ':' || {text}, 'n')")
    return f"md5({' || '.join([sql_literal(secret), *parts])}) COLLATE \"C\""


def _canonical_text(name: str, kind: str) -> str:
    """A value as text that every engine writes alike."""
    if kind not in _FLOATS:
        return f"CAST({name} AS TEXT)"
    value = f"CAST({name} AS DOUBLE)"
    return (f"(CASE WHEN {value} = CAST('NaN' AS DOUBLE) THEN 'nan' "
            f"WHEN {value} = CAST('Infinity' AS DOUBLE) THEN 'inf' "
            f"WHEN {value} = CAST('-Infinity' AS DOUBLE) THEN '-inf' "
            f"WHEN {value} = trunc({value}) AND abs({value}) < 1e15 "
            f"THEN CAST(CAST({value} AS BIGINT) AS TEXT) ELSE CAST({value} AS TEXT) END)")


def source_table(dataset: Dataset) -> str:
    """The table holding the dataset's rows, as SQL: the store's, or the engine's."""
    if dataset.engine is not None:
        return ".".join(quote(part) for part in dataset.engine.name_parts)
    return f"main.{quote(check_identifier(dataset.table, 'table'))}"


def bounded_sql(dataset: Dataset, secret: str, types: Mapping[str, str] | None = None) -> str:
    """A subquery (parenthesized, aliased ``_src``) over the dataset's bounded rows.

    Rows whose privacy unit is NULL are left out: nothing says whose they are, and
    bounding them together as one unit would let a person with a NULL unit displace
    another's kept row (an L1 change of 2 ``max_rows`` where the proof claims one).
    ``types``: the table's column types, needed for a dataset on another engine.
    """
    table = source_table(dataset)
    if dataset.privacy_unit is None:
        return f"(SELECT * FROM {table}) AS _src"
    unit = quote(dataset.privacy_unit)
    ranked = (
        f"SELECT *, row_number() OVER (PARTITION BY {unit} "
        f"ORDER BY {row_key_sql(dataset, secret, types)}) AS _dpsql_rank FROM {table} "
        f"WHERE {unit} IS NOT NULL"
    )
    if dataset.engine is not None:  # EXCLUDE is DuckDB's: list the declared columns
        kept = ", ".join(quote(name) for name in sorted(dataset.columns))
        return (f"(SELECT {kept} FROM ({ranked}) AS _ranked "
                f"WHERE _dpsql_rank <= {int(dataset.max_rows)}) AS _src")
    return (f"(SELECT * EXCLUDE (_dpsql_rank) FROM ({ranked}) "
            f"WHERE _dpsql_rank <= {int(dataset.max_rows)}) AS _src")


def bounded_relation(store: Store, dataset: Dataset,
                     cursor: duckdb.DuckDBPyConnection | None = None) -> duckdb.DuckDBPyRelation:
    """The bounded source as a DuckDB relation, for synthesizers (admin paths only)."""
    cur = cursor or store.cursor()
    return cur.sql(f"SELECT * FROM {bounded_sql(dataset, store.secret)}")
