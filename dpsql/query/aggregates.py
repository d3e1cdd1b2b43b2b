"""Aggregates of a DP query: what the analyst wrote, and the measures that pay for it.

``COUNT(*)``, ``COUNT(col)``, ``SUM(col)``, ``AVG(col)``, ``VAR_POP(col)``,
``VAR_SAMP(col)`` (``VARIANCE``), ``STDDEV_POP(col)`` and ``STDDEV_SAMP(col)``
(``STDDEV``), each optionally with ``FILTER (WHERE ...)``. A SUM or COUNT is
one measure; an AVG is two (a sum centred on the bounds' midpoint, and a
count); a variance or standard deviation three (the centred sum of squares,
the centred sum and the count). The same aggregate written twice, or a measure
two aggregates share (AVG(x) and VAR_POP(x) share two), is measured once.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.policy import Column
from dpsql.query.dialect import describe, reject
from dpsql.query.model import SPREAD, Aggregate, Measure
from dpsql.query.predicates import RowChecker, RowScope, sql_type

#: The accepted aggregate functions, by sqlglot node (DuckDB's VARIANCE is VAR_SAMP and
#: STDDEV is STDDEV_SAMP).
FUNCS: dict[type, str] = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.VariancePop: "var_pop",
    exp.Variance: "var_samp", exp.StddevPop: "stddev_pop", exp.StddevSamp: "stddev_samp",
    exp.Stddev: "stddev_samp"}
ACCEPTED = ("COUNT(*), COUNT(col), SUM(col), AVG(col), VAR_POP(col), VAR_SAMP(col), "
            "STDDEV_POP(col), STDDEV_SAMP(col)")
NO_MECHANISM = ("{name} has no differentially private mechanism in dpsql; estimate it from "
                "a histogram: GROUP BY dp_bin(col, WIDTH) with COUNT(*)")


def bounds_of(col: Column) -> tuple[float, float] | None:
    """Declared bounds of a numeric column, or the range of a numeric categorical's values."""
    if col.numeric and col.bounds is not None:
        return col.bounds
    if col.type == "categorical":
        values = [v for v in col.values or () if v is not None]
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                          for v in values):
            return float(min(values)), float(max(values))
    return None


class Aggregates:
    """The aggregates and measures of one query, registered as the parser finds them."""

    def __init__(self, text: str, scope: RowScope, rows: RowChecker) -> None:
        self.text = text
        self.scope = scope
        self.rows = rows
        self.aggregates: list[Aggregate] = []
        self.index: dict[str, int] = {}
        self.measures: list[Measure] = []

    def add(self, node: exp.Expr) -> int:
        """Register the aggregate call ``node`` (with its FILTER); returns its index."""
        predicate = None
        if isinstance(node, exp.Filter):
            where = node.expression
            predicate = self.rows.predicate(where.this if isinstance(where, exp.Where)
                                            else where, "FILTER")
            node = node.this
        func = FUNCS.get(type(node))
        if func is None:
            name = describe(node).replace("function ", "").upper()
            raise reject(self.text, NO_MECHANISM.format(name=name), node,
                         construct=f"aggregate {name}",
                         advice=f"accepted aggregates: {ACCEPTED}")
        arg = node.this
        if isinstance(arg, exp.Distinct):
            raise reject(self.text, f"{func.upper()}(DISTINCT ...) is not supported", node,
                         construct=f"{func.upper()}(DISTINCT)",
                         advice="a distinct count has no bounded sensitivity here; use "
                         "COUNT(*) with GROUP BY")
        extra = [k for k, v in node.args.items() if k not in ("this", "big_int") and v]
        if extra:
            raise reject(self.text, f"{func.upper()} takes one column", node,
                         construct=func.upper(), advice=f"write {func.upper()}(col)")
        column = self._aggregate_column(func, arg, node)
        label = f"{func.upper()}({column or '*'})"
        if predicate is not None:
            label += f" FILTER (WHERE {predicate.sql(dialect='duckdb')})"
        if label in self.index:
            return self.index[label]
        parts: tuple[int, ...]
        if func == "avg":
            parts = (self._measure(Measure("centered_sum", column, predicate)),
                     self._measure(Measure("count", column, predicate)))
        elif func in SPREAD:
            parts = tuple(self._measure(Measure(kind, column, predicate)) for kind in
                          ("centered_squares", "centered_sum", "count"))  # type: ignore[arg-type]
        else:
            parts = (self._measure(Measure("count" if func == "count" else "sum", column,
                                           predicate)),)
        self.aggregates.append(Aggregate(func, column, parts, label))  # type: ignore[arg-type]
        self.index[label] = len(self.aggregates) - 1
        return len(self.aggregates) - 1

    def _aggregate_column(self, func: str, arg: exp.Expr | None, node: exp.Expr) -> str | None:
        if func == "count" and (arg is None or isinstance(arg, exp.Star) or (
                isinstance(arg, exp.Literal) and not arg.is_string)):
            return None
        if not isinstance(arg, exp.Column):
            raise reject(self.text, f"{func.upper()} over an expression is not supported", node,
                         construct=f"{func.upper()}(expression)",
                         advice="aggregate a column (bounds are declared per column); filter "
                         "rows with WHERE or FILTER (WHERE ...)")
        col = self.scope.column(arg)
        if func != "count" and bounds_of(col) is None:
            raise reject(self.text, f"column {col.name!r} has no bounds in the policy", arg,
                         construct=f"{func.upper()}({col.name})",
                         advice="ask an administrator to declare bounds: [lo, hi], or use COUNT")
        if func != "count" and sql_type(self.scope.types[col.name]) != "num":
            raise reject(self.text, f"column {col.name!r} is not numeric", arg,
                         construct=f"{func.upper()}({col.name})", advice="use COUNT")
        return col.name

    def _measure(self, measure: Measure) -> int:
        if measure in self.measures:
            return self.measures.index(measure)
        self.measures.append(measure)
        return len(self.measures) - 1
