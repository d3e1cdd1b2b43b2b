"""Read-only SQL over released synthetic tables (``released.<name>``): free of charge.

The policy's public tables (``public_tables.<name>``) are read the same way.

Released tables are already differentially private, so any read-only query on
them is post-processing: joins, subqueries, CTEs and window functions are all
fine. What is checked is that the query reads nothing else: one SELECT (or set
operation), every table either ``released.<name>`` (and existing) or a CTE in
scope, no table functions (``read_csv``, ``query``, ...), no functions that
reach files, settings or the environment, no recursive CTEs. The validated
AST is re-rendered before it runs: the analyst's text never reaches DuckDB.
"""

from __future__ import annotations

import re

from sqlglot import exp
from sqlglot.optimizer.scope import traverse_scope

from dpsql.policy import did_you_mean
from dpsql.public import SCHEMA as PUBLIC_SCHEMA
from dpsql.query.dialect import DPOptions, describe, reject

SCHEMA = "released"
SCHEMAS = (SCHEMA, PUBLIC_SCHEMA)
_DENIED = re.compile(
    r"^(read_\w*|glob|getenv|current_setting|query|query_table|duckdb_\w*|pragma_\w*|"
    r"sniff_\w*|parquet_\w*|iceberg_\w*|delta_\w*|sql_auto_complete|which_secret|"
    r"load_\w*|install_\w*|enable_\w*|disable_\w*|checkpoint|force_checkpoint|summary|"
    r"test_\w*|current_database|current_schema|current_schemas|current_catalog|"
    r"getvariable|set_variable|file\w*|http\w*|s3\w*|to_parquet|copy\w*|export\w*|"
    r"repeat_row|range|generate_series|unnest_table|json_execute_serialized_sql|"
    r"txid_current|pg_\w*|has_\w*_privilege|col_description|obj_description|"
    r"nextval|currval|setval|lastval|setseed|histogram_values|json_serialize_plan|"
    r"json_serialize_sql|json_deserialize_sql)$",
    re.IGNORECASE)
_WRITES = (exp.DML, exp.DDL, exp.Command, exp.Into, exp.Set, exp.Pragma, exp.Use,
           exp.Copy, exp.Describe, exp.Summarize)


def free_name(schema: str, name: str) -> str:
    """A free table's name in the free database's list: bare if released, else qualified."""
    return name.lower() if schema.lower() == SCHEMA else f"{schema}.{name}".lower()


def reads_released(ast: exp.Expr) -> bool:
    """Whether the query names any ``released.<table>`` or ``public_tables.<table>``.

    It then takes this path; a DP query joins a public table by its bare name.
    """
    return any((t.db or "").lower() in SCHEMAS for t in ast.find_all(exp.Table))


def check_released(ast: exp.Expr, text: str, existing: set[str]) -> list[str]:
    """Validate a released-table query; returns the released tables it reads.

    ``existing`` holds the (lower-case) names of tables in schema ``released``.
    """
    if not isinstance(ast, exp.Query):
        raise reject(text, f"{describe(ast)} is not a query", ast, construct=describe(ast),
                     advice="write a SELECT over released.<table>")
    for node in ast.walk():
        if isinstance(node, _WRITES):
            raise reject(text, f"{describe(node)} is not allowed", node,
                         construct=describe(node), advice="released tables are read-only")
        if isinstance(node, DPOptions):
            raise reject(text, "WITH DIFFERENTIAL_PRIVACY is for queries on sensitive datasets",
                         node, construct="WITH DIFFERENTIAL_PRIVACY",
                         advice="released tables are already DP: query them directly")
        if isinstance(node, exp.With) and node.args.get("recursive"):
            raise reject(text, "recursive CTEs are not allowed", node,
                         construct="WITH RECURSIVE", advice="use a non-recursive query")
        if isinstance(node, exp.Lateral) and not isinstance(node.this, exp.Subquery):
            raise reject(text, f"LATERAL {describe(node.this)} is not allowed", node,
                         construct="LATERAL", advice="a LATERAL join takes a subquery "
                         "over released.<table>; table functions are not allowed")
        if isinstance(node, (exp.Placeholder, exp.Parameter)):
            raise reject(text, "query parameters are not supported", node,
                         construct="parameter", advice="write the values into the query")
        if isinstance(node, exp.Func):
            name = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
            if _DENIED.match(name) or isinstance(node, exp.ReadCSV):
                raise reject(text, f"function {name.lower()} is not allowed here", node,
                             construct=f"function {name.lower()}",
                             advice="a query may read released.<name> tables and public "
                             "constants, never files, settings, the environment or other "
                             "tables")
    return _tables(ast, text, existing)


def _tables(ast: exp.Expr, text: str, existing: set[str]) -> list[str]:
    seen: set[int] = set()
    found: list[exp.Table] = []
    for scope in traverse_scope(ast):
        for table in scope.tables:
            seen.add(id(table))
            if not isinstance(table.this, exp.Identifier):
                raise reject(text, f"{describe(table.this)} is not allowed in FROM", table,
                             construct=describe(table.this),
                             advice="read released.<table>; table functions are not allowed")
            if not table.db and not table.args.get("catalog") and table.name in scope.cte_sources:
                continue
            if table.args.get("catalog") or (table.db or "").lower() not in SCHEMAS:
                raise reject(text, f"{table.sql()} is not a released table", table,
                             construct="table", advice="a query may read released.<table> "
                             "and public_tables.<table> tables together, or ask a DP question "
                             "of one dataset alone (joined to a public table by its bare name: "
                             "JOIN edu, not JOIN public_tables.edu)")
            found.append(table)
    for table in ast.find_all(exp.Table):
        if id(table) not in seen:
            raise reject(text, f"{table.sql()} cannot be read here", table, construct="table",
                         advice="read released.<table> in FROM or JOIN")
    for table in found:
        if table.db.lower() == PUBLIC_SCHEMA and free_name(table.db, table.name) not in existing:
            raise reject(text, f"no public table {table.name!r}", table, construct="table",
                         advice="the policy's public_tables: section lists them")
        if free_name(table.db, table.name) not in existing:
            raise reject(text, f"no released table {table.name!r}"
                         f"{did_you_mean(table.name.lower(), sorted(existing))}", table,
                         construct="table", advice="SHOW dpsql.released lists them")
    return sorted({free_name(t.db, t.name) for t in found})
