"""The JOIN of a dataset to one public table, checked from the policy and the table alone.

Accepted: ``FROM dataset [INNER | LEFT [OUTER]] JOIN table ON dataset.col = table.key``
where ``table`` is one of the policy's public tables (:mod:`dpsql.public`) and
``key`` its unique key, on a dataset in the store. Its columns then join the
query's scope under ``<table>.<column>``.

Privacy: the key is unique, so each private row meets at most one public row and
every measure keeps its sensitivity; an inner join drops the rows with no match,
a row-level filter. Everything here reads public data only and runs before the
charge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from sqlglot import exp

from dpsql.policy import Column, Policy, PublicTable, did_you_mean
from dpsql.query.dialect import describe, reject, unparen
from dpsql.query.literals import sql_type, total_numeric
from dpsql.query.model import Join
from dpsql.query.predicates import PublicScope, RowScope

_ADVICE = "write FROM dataset [LEFT] JOIN public_table ON dataset.column = public_table.key"
_TABLE_ARGS = ("joins", "laterals", "pivots", "sample", "version", "when", "changes")


class PublicCatalog(Protocol):
    """What the planner may read about the policy's public tables (public data only)."""

    def types(self, table: str) -> Mapping[str, str]:
        """Column -> DuckDB type of public table ``table``."""

    def values(self, table: str, column: str) -> tuple[Any, ...]:
        """The sorted distinct values of a public column, NULL last if it holds one."""


def check_join(text: str, policy: Policy, scope: RowScope, joins: list[exp.Join],
               catalog: PublicCatalog | None) -> tuple[RowScope, Join]:
    """The scope widened by the joined public table's columns, and the join; or a rejection."""
    dataset = scope.dataset
    if len(joins) > 1:
        raise reject(text, "a DP query may join one public table", joins[1], construct="JOIN",
                     advice=_ADVICE)
    join = joins[0]
    if dataset.engine is not None:
        raise reject(text, f"joins run on datasets in the store; {dataset.name} is on "
                     f"{dataset.engine.product}", join, construct="JOIN",
                     advice=f"query {dataset.name} without a join")
    side, kind = (join.side or "").upper(), (join.kind or "").upper()
    if join.method or side not in ("", "LEFT") or kind not in ("", "INNER", "OUTER") \
            or (kind == "OUTER" and not side) or join.args.get("using"):
        name = " ".join(p for p in (join.method, side, kind, "JOIN") if p).upper()
        name += " USING" if join.args.get("using") else ""
        raise reject(text, f"{name} is not allowed in DP queries", join, construct=name,
                     advice=_ADVICE)
    public = _public_table(text, policy, scope, join.this)
    on = join.args.get("on")
    if on is None:
        raise reject(text, f"a join of {public.name} needs ON", join,
                     construct="JOIN without ON", advice=_ADVICE)
    types = catalog.types(public.name) if catalog is not None else {}
    if public.key not in types:
        raise reject(text, f"public table {public.name} is not in the store", join.this,
                     construct="JOIN", advice="ask an administrator to apply the policy again "
                     "(dpsql policy apply)")
    alias = join.this.args.get("alias")
    qualifiers = frozenset({(alias.name if alias is not None else public.name).lower()})
    if qualifiers & scope.qualifiers:
        raise reject(text, f"the dataset and {public.name} share a name", join.this,
                     construct="table alias", advice="give them different aliases")
    wider = RowScope(text, dataset, {
        **scope.types, **{f"{public.name}.{c}": t for c, t in types.items()}},
        scope.qualifiers, PublicScope(public.name, qualifiers, tuple(types)))
    on_column = _on(text, wider, unparen(on), public.key)
    return wider, Join(public.name, public.key, on_column, side != "LEFT", tuple(types))


def _public_table(text: str, policy: Policy, scope: RowScope, table: exp.Expr) -> PublicTable:
    """The policy's public table that ``table`` names, or a rejection."""
    names = list(policy.public_tables)
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier) \
            or table.args.get("catalog") or any(table.args.get(a) for a in _TABLE_ARGS):
        raise reject(text, f"{describe(table)} is not allowed in JOIN", table,
                     construct=describe(table), advice="join a public table by name")
    alias = table.args.get("alias")
    if alias is not None and alias.args.get("columns"):
        raise reject(text, "column aliases on the table are not allowed", alias,
                     construct="table alias", advice="alias columns in the SELECT list")
    name = table.name.lower()
    found: list[PublicTable] = []
    if not table.db or table.db.lower() == "main":  # public_tables.<name> takes the free path
        found = [t for t in policy.public_tables.values() if t.name.lower() == name]
        if not found and any(name in (d.name.lower(), d.table.lower())
                             for d in policy.datasets.values()):
            raise reject(text, f"joining two datasets ({scope.dataset.name} and {table.name}) "
                         "is not allowed", table, construct="JOIN of datasets",
                         advice="join a dataset to a public table only; query each dataset "
                         "separately")
    if not found:
        raise reject(text, f"JOIN {table.sql()}: not a public table"
                     f"{did_you_mean(table.name, names)}", table, construct="JOIN",
                     advice=("public tables: " + ", ".join(names)) if names else
                     "this policy declares no public_tables")
    return found[0]


def _on(text: str, scope: RowScope, on: exp.Expr, key: str) -> str:
    """The dataset column of ``dataset.col = table.key``; anything else is refused.

    The two columns must compare without a cast that could fail on some row:
    text with text, or numbers of types whose comparisons never raise.
    """
    sides = [unparen(s) for s in (on.this, on.expression)] if isinstance(on, exp.EQ) else []
    columns = [s for s in sides if isinstance(s, exp.Column)]
    public = scope.public
    assert public is not None
    cols = [scope.column(s) for s in columns]
    found = [c for c in cols if public.holds(c)]
    if len(columns) != 2 or len(found) != 1:
        raise reject(text, "a join condition compares a dataset column with the public "
                     "table's key for equality", on, construct="join condition",
                     advice="write ON dataset.column = public_table.key")
    key_name = f"{public.table}.{key}"
    if found[0].name != key_name:
        raise reject(text, f"{found[0].name} is not the key of {public.table}",
                     columns[cols.index(found[0])], construct="join on a non-key column",
                     advice=f"join on {key_name}, whose values are unique (each row then "
                     "matches at most one public row)")
    private = cols[1] if cols[0] is found[0] else cols[0]
    kinds = {scope.types[c.name] for c in cols}
    if len({sql_type(k) for k in kinds}) != 1 or not all(
            total_numeric(k) or sql_type(k) == "str" for k in kinds):
        raise reject(text, f"{private.name} ({scope.types[private.name]}) and {key_name} "
                     f"({scope.types[key_name]}) cannot be compared", on,
                     construct="join condition",
                     advice="join an integer or text column to a key of the same kind")
    return private.name


def public_key(col: Column, join: Join, catalog: PublicCatalog) -> Column:
    """A public GROUP BY column with its key set: the table's distinct values (public).

    NULL is a key when the column holds one, and after a LEFT JOIN (rows with no match).
    """
    values = catalog.values(join.table, col.name.split(".", 1)[1])
    return replace(col, values=tuple(v for v in values if v is not None),
                   nullable=None in values or not join.inner)
