"""The bounded source: a dataset's rows after contribution bounding, as SQL.

Privacy: each privacy unit keeps at most ``max_rows`` rows, chosen by a keyed
hash of the row's *values* (never its physical position), seeded with the
store's secret so the choice is fixed per store and cannot be steered or
predicted by the analyst. Removing one unit leaves every other unit's rows,
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
    r"""SQL for a row's choice key: the MD5 digest of ``secret || json_array(v1, ..., vn)``.

    The values are every column the policy declares (hidden ones and the privacy
    unit included), in column-name order. JSON is the canonical text: a string is
    quoted and escaped, so no value can forge a separator, and NULL (``null``)
    differs from every string. Rows with equal keys are equal in every declared
    column, so whichever of them is kept, every query sees the same rows.

    What a later engine (Spark, PostgreSQL) must reproduce to choose the same
    rows: the text DuckDB's ``json_array`` writes, with no spaces: integers in
    decimal; strings in double quotes with ``"``, ``\`` and control characters
    escaped (``\n``, ``\u0001``) and other characters raw UTF-8; ``true``/``false``;
    ``null``; doubles in the shortest round-trip form with ``.0`` for whole
    numbers (``1.5``, ``100.0``, ``1e-7``, ``-0.0``, ``NaN``, ``Infinity``); dates
    and timestamps as quoted ISO text. The store secret is prefixed as-is (64 hex
    digits); rows are ranked per unit by the digest's 16 bytes read as an
    unsigned little-endian integer (DuckDB's ``md5_number``), ascending. MD5
    only spreads the choice; the secret makes it unpredictable. A DuckDB version that
    spelled values differently would change the choice, never the bound (each
    query's choice is still a function of the rows alone).
    """
    values = ", ".join(quote(name) for name in sorted(dataset.columns))
    return f"md5_number({sql_literal(secret)} || json_array({values}))"


def bounded_sql(dataset: Dataset, secret: str) -> str:
    """A subquery (parenthesized, aliased ``_src``) over the dataset's bounded rows."""
    table = f"main.{quote(check_identifier(dataset.table, 'table'))}"
    if dataset.privacy_unit is None:
        return f"(SELECT * FROM {table}) AS _src"
    unit = quote(dataset.privacy_unit)
    ranked = (
        f"SELECT *, row_number() OVER (PARTITION BY {unit} "
        f"ORDER BY {row_key_sql(dataset, secret)}) AS _dpsql_rank FROM {table}"
    )
    return (f"(SELECT * EXCLUDE (_dpsql_rank) FROM ({ranked}) "
            f"WHERE _dpsql_rank <= {int(dataset.max_rows)}) AS _src")


def bounded_relation(store: Store, dataset: Dataset,
                     cursor: duckdb.DuckDBPyConnection | None = None) -> duckdb.DuckDBPyRelation:
    """The bounded source as a DuckDB relation, for synthesizers (admin paths only)."""
    cur = cursor or store.cursor()
    return cur.sql(f"SELECT * FROM {bounded_sql(dataset, store.secret)}")
