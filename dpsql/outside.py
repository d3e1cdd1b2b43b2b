"""Domain checks: rows whose values lie outside the policy's declared domains.

A categorical value the policy does not list (NULL included, unless listed) is
never part of a GROUP BY answer: the row counts in totals but in no group. A
number outside its bounds is clamped by every query, silently. (A NULL in a
numeric column is not checked: SUM and AVG skip it, as SQL does.) ``dpsql
init``, ``dpsql policy check --db`` and ``dpsql policy apply`` therefore look
for such values and refuse unless the administrator says what to do with them
(:data:`HANDLINGS`).

Not DP: the findings (counts, example values) are read from the private rows
for an administrator's eyes only. Callers check the role first and audit the
read (:meth:`dpsql.session.Session.check_domain`); nothing here reaches analysts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from dpsql.errors import ConfigurationError

if TYPE_CHECKING:  # the CLI reads HANDLINGS at startup: DuckDB and NumPy load when used
    import duckdb

    from dpsql.policy import Column, Dataset

Handling = Literal["refuse", "drop", "clamp", "keep"]

#: What to do with values outside the domain, as the CLI's ``--outside`` offers it.
HANDLINGS: dict[str, str] = {
    "refuse": "report them and change nothing (the default)",
    "drop": "delete the rows that hold them",
    "clamp": "set numbers outside their bounds to the nearest bound (refused if a "
             "category or NaN is outside: those cannot be clamped)",
    "keep": "keep them as they are: numbers are clamped in each query, other values "
            "count in totals but in no group",
}
EXAMPLES = 3
_NUMERIC_SQL = ("INT", "DECIMAL", "DOUBLE", "FLOAT", "REAL")


@dataclass(frozen=True)
class Outside:
    """The rows of one column whose value is outside its declared domain.

    For an administrator only: ``rows`` and ``examples`` are read from private data.
    """

    dataset: str
    column: str
    rows: int
    examples: tuple[Any, ...]
    clampable: bool  # every such value is a number (not NaN), so it can be clamped

    def describe(self, examples: bool = True) -> str:
        """One line: where, how many rows and (with ``examples``) a few of the values."""
        shown = ", ".join("NULL" if v is None else repr(v) for v in self.examples)
        return (f"{self.dataset}.{self.column}: {self.rows} row(s) outside the domain"
                + (f" (e.g. {shown})" if examples and shown else ""))


class DomainError(ConfigurationError):
    """Values outside the declared domains, and no instruction to drop, clamp or keep them.

    Raised only on administrator paths; the message names columns, never values or
    counts (those are in ``found``).
    """

    def __init__(self, message: str, found: list[Outside]) -> None:
        super().__init__(message)
        self.found = found


def outside_predicate(col: Column, sql_type: str) -> str | None:
    """SQL that is true for a row whose ``col`` value is outside the domain.

    None when the table column cannot be compared with the declared domain (a type
    mismatch, which :meth:`dpsql.store.Store.check_policy` reports on its own).
    """
    from dpsql.domain import quote, sql_literal

    name = quote(col.name)
    numeric_sql = any(t in sql_type.upper() for t in _NUMERIC_SQL)
    if col.numeric:
        if not numeric_sql or col.bounds is None:
            return None
        lo, hi = (_bound(b) for b in col.bounds)
        return f"(NOT ({name} BETWEEN {lo} AND {hi}))"  # NULL: not outside; NaN: outside
    null = "" if col.nullable else f"{name} IS NULL OR "
    if col.type != "categorical" or col.values is None:  # no value list: nothing is outside
        return None
    listed = [v for v in col.values or () if v is not None]
    textual = not numeric_sql and sql_type.upper() != "BOOLEAN"
    if any(isinstance(v, str) != textual for v in listed):
        return None
    if not listed:
        return f"({null}{name} IS NOT NULL)"
    return f"({null}{name} NOT IN ({', '.join(sql_literal(v) for v in listed)}))"


def find_outside(cur: duckdb.DuckDBPyConnection, relation: str, ds: Dataset,
                 types: Mapping[str, str]) -> list[Outside]:
    """Per column of ``ds``, the rows of ``relation`` outside the declared domain.

    One pass counts every column; a second query per affected column picks its
    most frequent outside values as examples.
    """
    from dpsql.domain import quote

    predicates = {c.name: p for c in ds.columns.values() if c.name in types
                  and (p := outside_predicate(c, types[c.name])) is not None}
    if not predicates:
        return []
    counts = []
    for name, pred in predicates.items():
        stuck = "TRUE" if not ds.columns[name].numeric else \
            f"isnan({quote(name)}::DOUBLE)"
        counts += [f"count(*) FILTER (WHERE {pred})",
                   f"count(*) FILTER (WHERE {pred} AND ({stuck}))"]
    row = cur.execute(f"SELECT {', '.join(counts)} FROM {relation}").fetchone()
    assert row is not None
    found = []
    for i, (name, pred) in enumerate(predicates.items()):
        rows, unclampable = int(row[2 * i]), int(row[2 * i + 1])
        if rows:
            examples = cur.execute(
                f"SELECT {quote(name)} FROM {relation} WHERE {pred} GROUP BY ALL "
                f"ORDER BY count(*) DESC, 1 NULLS FIRST LIMIT {EXAMPLES}").fetchall()
            found.append(Outside(ds.name, name, rows, tuple(e[0] for e in examples),
                                 clampable=unclampable == 0))
    return found


def refusal(found: list[Outside], handling: Handling) -> DomainError | None:
    """The error to raise for ``found`` under ``handling``, or None to go ahead."""
    if not found or handling in ("drop", "keep"):
        return None
    if handling == "clamp":
        stuck = [f"{o.dataset}.{o.column}" for o in found if not o.clampable]
        if not stuck:
            return None
        return DomainError(
            f"{', '.join(stuck)} hold categories or NaNs outside the declared domain, "
            "which cannot be clamped; declare them in the policy, or choose --outside drop "
            "or --outside keep", found)
    columns = ", ".join(f"{o.dataset}.{o.column}" for o in found)
    return DomainError(
        f"{columns} hold values outside the domain the policy declares (queries would clamp "
        "such numbers and leave such categories out of every group); declare them in the "
        "policy (values, bounds, nullable), or choose --outside drop, clamp or keep (--help "
        "explains each)", found)


def settle(cur: duckdb.DuckDBPyConnection, relation: str, ds: Dataset,
           types: Mapping[str, str], handling: Handling, *, fresh: bool = False
           ) -> list[Outside]:
    """Find the values outside the domain and handle them as told, in ``cur``'s transaction.

    Raises :class:`DomainError` (before writing anything) when ``handling`` does not
    allow going ahead; returns what was found. ``fresh`` says ``relation`` is a table
    without constraints made in this transaction (an import): dropping then copies the
    rows kept, as DuckDB holds about 100 bytes of memory per deleted row until commit.
    """
    import duckdb

    from dpsql.domain import quote

    found = find_outside(cur, relation, ds, types)
    error = refusal(found, handling)
    if error is not None:
        raise error
    # find_outside reports only columns that have a predicate: the filter drops nothing
    predicates = {o.column: p for o in found
                  if (p := outside_predicate(ds.columns[o.column], types[o.column]))
                  is not None}
    if found and handling == "drop":
        outside = " OR ".join(predicates.values())
        if fresh:
            cur.execute(f"CREATE OR REPLACE TABLE {relation} AS SELECT * FROM {relation} "
                        f"WHERE ({outside}) IS NOT TRUE")
        else:
            cur.execute(f"DELETE FROM {relation} WHERE {outside}")
    elif handling == "clamp":
        for name, pred in predicates.items():
            lo, hi = (_bound(b) for b in ds.columns[name].bounds or (0, 0))
            try:
                cur.execute(f"UPDATE {relation} SET {quote(name)} = least(greatest("
                            f"{quote(name)}, {lo}), {hi}) WHERE {pred}")
            except duckdb.ConstraintException as err:
                raise DomainError(f"{ds.name}.{name}: the clamped values would break the "
                                  "table's CHECK constraint (from --enforce-bounds); choose "
                                  "--outside drop, or bounds that overlap the old ones",
                                  found) from err
    return found


def _bound(value: float) -> str:
    """A declared bound as a SQL literal (integral bounds as integers)."""
    from dpsql.domain import sql_literal

    return sql_literal(int(value) if float(value).is_integer() else value)


def summary(found: list[Outside], handling: Handling, *, done: bool = True) -> list[str]:
    """Lines for the administrator: what was found and what was (or would be) done with it."""
    verb = {"refuse": "refused", "drop": "rows dropped", "clamp": "clamped to the bounds",
            "keep": "kept as they are"}[handling]
    if not done and handling != "refuse":
        verb = f"with --outside {handling}"
    return [f"{o.describe()}: {verb}" for o in found]
