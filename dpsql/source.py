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

import duckdb

from dpsql.domain import quote, sql_literal
from dpsql.policy import Dataset
from dpsql.store import Store, check_identifier


def row_key_sql(dataset: Dataset, secret: str) -> str:
    """SQL for a row's choice key: DuckDB's ``hash`` of the secret and the row's values.

    The values are every column the policy declares (hidden ones and the privacy
    unit included), in column-name order, so rows with equal keys are equal in
    every declared column (up to a 64-bit collision) and whichever of them is
    kept, every query sees the same rows. The choice is a function of the unit's
    own rows, which is all the sensitivity bound needs; the secret keeps it from
    being steered by the analyst. ``hash`` treats ``-0.0`` as ``0.0``, all NaNs
    alike and NULL apart from every value.

    DuckDB's ``hash`` is its own, and it costs what the old ``rowid`` hash did.
    A portable key, ``md5_number(secret || json_array(...))``, ran 2.4-4x slower on
    10M rows (benchmarks/query_overhead.py ``--unit-rows``). An engine that must
    choose the same rows as DuckDB (issue 24) needs a key that every engine
    computes alike, and will pay that cost there. A DuckDB version whose ``hash``
    changed would change the choice, never the bound.
    """
    values = ", ".join(quote(name) for name in sorted(dataset.columns))
    return f"hash({sql_literal(secret)}, {values})"


def bounded_sql(dataset: Dataset, secret: str) -> str:
    """A subquery (parenthesized, aliased ``_src``) over the dataset's bounded rows.

    Rows whose privacy unit is NULL are left out: nothing says whose they are, and
    bounding them together as one unit would let a person with a NULL unit displace
    another's kept row (an L1 change of 2 ``max_rows`` where the proof claims one).
    """
    table = f"main.{quote(check_identifier(dataset.table, 'table'))}"
    if dataset.privacy_unit is None:
        return f"(SELECT * FROM {table}) AS _src"
    unit = quote(dataset.privacy_unit)
    ranked = (
        f"SELECT *, row_number() OVER (PARTITION BY {unit} "
        f"ORDER BY {row_key_sql(dataset, secret)}) AS _dpsql_rank FROM {table} "
        f"WHERE {unit} IS NOT NULL"
    )
    return (f"(SELECT * EXCLUDE (_dpsql_rank) FROM ({ranked}) "
            f"WHERE _dpsql_rank <= {int(dataset.max_rows)}) AS _src")


def bounded_relation(store: Store, dataset: Dataset,
                     cursor: duckdb.DuckDBPyConnection | None = None) -> duckdb.DuckDBPyRelation:
    """The bounded source as a DuckDB relation, for synthesizers (admin paths only)."""
    cur = cursor or store.cursor()
    return cur.sql(f"SELECT * FROM {bounded_sql(dataset, store.secret)}")
