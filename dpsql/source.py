"""The bounded source: a dataset's rows after contribution bounding, as SQL.

Privacy: each privacy unit keeps at most ``max_rows`` rows, chosen by a hash
seeded with the store's secret (so the choice is fixed per store and cannot
be steered by the analyst). A count over the result then has sensitivity
``max_rows`` under add/remove of one unit. Without a privacy unit each row is
its own unit and nothing is dropped.
"""

from __future__ import annotations

import duckdb

from dpsql.domain import quote, sql_literal
from dpsql.policy import Dataset
from dpsql.store import Store, check_identifier


def bounded_sql(dataset: Dataset, secret: str) -> str:
    """A subquery (parenthesized, aliased ``_src``) over the dataset's bounded rows."""
    table = f"main.{quote(check_identifier(dataset.table, 'table'))}"
    if dataset.privacy_unit is None:
        return f"(SELECT * FROM {table}) AS _src"
    unit = quote(dataset.privacy_unit)
    salt = sql_literal(secret)
    ranked = (
        f"SELECT *, row_number() OVER (PARTITION BY {unit} "
        f"ORDER BY hash({salt} || CAST({unit} AS VARCHAR) || CAST(rowid AS VARCHAR))) "
        f"AS _dpsql_rank FROM {table}"
    )
    return (f"(SELECT * EXCLUDE (_dpsql_rank) FROM ({ranked}) "
            f"WHERE _dpsql_rank <= {int(dataset.max_rows)}) AS _src")


def bounded_relation(store: Store, dataset: Dataset,
                     cursor: duckdb.DuckDBPyConnection | None = None) -> duckdb.DuckDBPyRelation:
    """The bounded source as a DuckDB relation, for synthesizers (admin paths only)."""
    cur = cursor or store.cursor()
    return cur.sql(f"SELECT * FROM {bounded_sql(dataset, store.secret)}")
