"""Public tables: non-sensitive lookup tables a DP query may join a dataset to.

The policy's ``public_tables:`` section names them; applying the policy copies
each one into the store's ``public_tables`` schema, in the policy's transaction,
and checks that its key is unique (the table is public, so checking costs no
privacy). A unique key is what keeps a join's sensitivity unchanged: each
private row matches at most one public row. The free database holds a copy too
(:mod:`dpsql.query.free`), so analysts read them free of charge.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from dpsql.domain import quote
from dpsql.errors import PolicyError
from dpsql.imports import open_file
from dpsql.policy import Policy, PublicTable
from dpsql.store import check_identifier

SCHEMA = "public_tables"
#: Key types whose equality is plain: no float's -0.0 or NaN, no collation.
KEY_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
             "VARCHAR")


def load_public_tables(cur: duckdb.DuckDBPyConnection, policy: Policy) -> list[str]:
    """Copy the policy's public tables into the store (dropping others); returns change lines."""
    cur.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    old = {r[0] for r in cur.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = ?", [SCHEMA]).fetchall()}
    for name in sorted(old - set(policy.public_tables)):
        cur.execute(f"DROP TABLE {SCHEMA}.{quote(name)}")
    changes = []
    for table in policy.public_tables.values():
        rows = _copy(cur, table, policy)
        check_key(cur, table, policy.source)
        changes.append(f"public table {table.name}: {rows} rows")
    return changes


def _copy(cur: duckdb.DuckDBPyConnection, table: PublicTable, policy: Policy) -> int:
    target = f"{SCHEMA}.{quote(check_identifier(table.name, 'public table'))}"
    if table.table is not None:
        try:
            cur.execute(f"CREATE OR REPLACE TABLE {target} AS SELECT * FROM "
                        f"main.{quote(check_identifier(table.table, 'table'))}")
        except duckdb.CatalogException:
            raise PolicyError(f"{policy.source}: public_tables.{table.name}.table: the store "
                              f"has no table {table.table!r}; import it first") from None
    else:
        assert table.path is not None
        with open_file(_resolve(table.path, policy.source)) as rel:
            data = rel.to_arrow_table()
        cur.register("_dpsql_public", data)
        try:
            cur.execute(f"CREATE OR REPLACE TABLE {target} AS SELECT * FROM _dpsql_public")
        finally:
            cur.unregister("_dpsql_public")
    row = cur.execute(f"SELECT count(*) FROM {target}").fetchone()
    return int(row[0]) if row else 0


def _resolve(path: str, source: str) -> Path:
    """``path`` relative to the policy file's folder (or the working folder)."""
    folder = Path(source).parent
    return folder / path if folder.is_dir() and not Path(path).is_absolute() else Path(path)


def check_key(cur: duckdb.DuckDBPyConnection, table: PublicTable, source: str) -> None:
    """Refuse a public table whose key is missing, of a float type, or not unique."""
    where = f"{source}: public_tables.{table.name}.key"
    types = column_types(cur, table.name)
    kind = types.get(table.key)
    if kind is None:
        raise PolicyError(f"{where}: table {table.name} has no column {table.key!r} "
                          f"(columns: {', '.join(types)})")
    if kind.upper() not in KEY_TYPES:
        raise PolicyError(f"{where}: column {table.key!r} is {kind}; a join key must be an "
                          "integer or text column")
    dupes = cur.execute(
        f"SELECT {quote(table.key)}, count(*) FROM {SCHEMA}.{quote(table.name)} "
        f"WHERE {quote(table.key)} IS NOT NULL GROUP BY ALL HAVING count(*) > 1 LIMIT 1"
    ).fetchone()
    if dupes is not None:
        raise PolicyError(f"{where}: the key {table.key!r} is not unique ({dupes[0]!r} appears "
                          f"{dupes[1]} times); each private row must match at most one public "
                          "row, so deduplicate the table or name a unique key")


def column_types(cur: duckdb.DuckDBPyConnection, name: str) -> dict[str, str]:
    """The columns of public table ``name`` and their DuckDB types, in table order."""
    rows = cur.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_catalog = current_database() AND table_schema = ? AND table_name = ? "
        "ORDER BY ordinal_position", [SCHEMA, name]).fetchall()
    return {str(r[0]): str(r[1]) for r in rows}


def distinct_values(cur: duckdb.DuckDBPyConnection, name: str, column: str) -> tuple[object, ...]:
    """The sorted distinct values of a public column, NULL last if it holds one: a key set."""
    rows = cur.execute(f"SELECT DISTINCT {quote(column)} FROM {SCHEMA}.{quote(name)} "
                       "ORDER BY 1 NULLS LAST").fetchall()
    return tuple(r[0] for r in rows)
