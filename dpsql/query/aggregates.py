"""Aggregates of a DP query: what the analyst wrote, and the measures that pay for it.

``COUNT(*)``, ``COUNT(col)``, ``COUNT(DISTINCT col)``, ``SUM(col)``,
``AVG(col)``, ``VAR_POP(col)``, ``VAR_SAMP(col)`` (``VARIANCE``),
``STDDEV_POP(col)``, ``STDDEV_SAMP(col)`` (``STDDEV``) and the quantiles
(``MEDIAN``, ``PERCENTILE_CONT``, ``QUANTILE_CONT``, ``MIN``, ``MAX``: see
:mod:`dpsql.query.quantile`), each optionally with ``FILTER (WHERE ...)``. A
SUM, COUNT, distinct count or quantile is one measure; an AVG is two (a sum
centred on the bounds' midpoint, and a count); a variance or standard deviation
three (the centred sum of squares, the centred sum and the count). The same
aggregate written twice, or a measure two aggregates share (AVG(x) and
VAR_POP(x) share two), is measured once.
"""

from __future__ import annotations

from fractions import Fraction

from sqlglot import exp

from dpsql.policy import Column
from dpsql.query.dialect import describe, reject
from dpsql.query.literals import sql_type
from dpsql.query.model import SPREAD, Aggregate, Measure
from dpsql.query.predicates import RowChecker, RowScope
from dpsql.query.quantile import quantile_call

#: The accepted aggregate functions, by sqlglot node (DuckDB's VARIANCE is VAR_SAMP and
#: STDDEV is STDDEV_SAMP).
FUNCS: dict[type, str] = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.VariancePop: "var_pop",
    exp.Variance: "var_samp", exp.StddevPop: "stddev_pop", exp.StddevSamp: "stddev_samp",
    exp.Stddev: "stddev_samp"}
ACCEPTED = ("COUNT(*), COUNT(col), COUNT(DISTINCT col), SUM(col), AVG(col), VAR_POP(col), "
            "VAR_SAMP(col), STDDEV_POP(col), STDDEV_SAMP(col), MEDIAN(col), QUANTILE_CONT(col, q), "
            "MIN(col), MAX(col)")
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
        quantile = quantile_call(self.text, node)
        if quantile is not None:
            return self._quantile(*quantile, node, predicate)
        func = FUNCS.get(type(node))
        if func is None:
            shown = node.this if isinstance(node, exp.WithinGroup) else node
            name = describe(shown).replace("function ", "").upper()
            raise reject(self.text, NO_MECHANISM.format(name=name), node,
                         construct=f"aggregate {name}",
                         advice=f"accepted aggregates: {ACCEPTED}")
        arg = node.this
        extra = [k for k, v in node.args.items() if k not in ("this", "big_int") and v]
        if extra:
            raise reject(self.text, f"{func.upper()} takes one column", node,
                         construct=func.upper(), advice=f"write {func.upper()}(col)")
        if isinstance(arg, exp.Distinct):
            return self._distinct(func, arg, node, predicate)
        column = self._aggregate_column(func, arg, node)
        label = f"{func.upper()}({column or '*'})"
        if func == "avg":
            measures = [Measure("centered_sum", column, predicate),
                        Measure("count", column, predicate)]
        elif func in SPREAD:
            measures = [Measure(kind, column, predicate)
                        for kind in ("centered_squares", "centered_sum", "count")]
        else:
            measures = [Measure("count" if func == "count" else "sum", column, predicate)]
        return self._register(func, column, label, predicate, measures)

    def _distinct(self, func: str, arg: exp.Distinct, node: exp.Expr,
                  predicate: exp.Expr | None) -> int:
        """``COUNT(DISTINCT col)``: one measure, the distinct non-NULL values of a column.

        Privacy: a row adds at most one distinct value to its cell, so the count has
        COUNT(*)'s sensitivity (``max_rows``); a sum or average of distinct values
        would not be bounded by the rows a unit keeps, and is refused.
        """
        name = func.upper()
        if func != "count":
            raise reject(self.text, f"{name}(DISTINCT ...) is not supported", node,
                         construct=f"{name}(DISTINCT)",
                         advice=f"write {name}(col), or COUNT(DISTINCT col) for the number "
                         "of distinct values")
        if len(arg.expressions) != 1 or arg.args.get("on") is not None:
            raise reject(self.text, "COUNT(DISTINCT ...) takes one column", node,
                         construct="COUNT(DISTINCT a, b)",
                         advice="count the distinct values of one column, and GROUP BY the "
                         "other")
        value = arg.expressions[0]
        if not isinstance(value, exp.Column):
            raise reject(self.text, "COUNT(DISTINCT ...) over an expression is not supported",
                         value, construct="COUNT(DISTINCT expression)",
                         advice="count the distinct values of a column")
        column = self.scope.measured(value).name
        return self._register("count_distinct", column, f"COUNT(DISTINCT {column})", predicate,
                              [Measure("distinct", column, predicate)])

    def _quantile(self, name: str, arg: exp.Expr, q: Fraction, node: exp.Expr,
                  predicate: exp.Expr | None) -> int:
        """A DP quantile: one measure of the column's grid positions (see quantile.py)."""
        if isinstance(arg, exp.Distinct):
            raise reject(self.text, f"{name}(DISTINCT ...) is not supported", node,
                         construct=f"{name}(DISTINCT)",
                         advice=f"write {name} over the column; distinct values have no "
                         "bounded sensitivity here")
        column = self._aggregate_column(name.lower(), arg, node)
        if name.startswith("PERCENTILE_"):
            label = f"{name}({q}) WITHIN GROUP (ORDER BY {column})"
        elif name.startswith("QUANTILE_"):
            label = f"{name}({column}, {q})"
        else:
            label = f"{name}({column})"
        func = name.lower() if name in ("MEDIAN", "MIN", "MAX") else "quantile"
        return self._register(func, column, label, predicate,
                              [Measure("quantile", column, predicate, q)])

    def _register(self, func: str, column: str | None, label: str, predicate: exp.Expr | None,
                  measures: list[Measure]) -> int:
        if predicate is not None:
            label += f" FILTER (WHERE {predicate.sql(dialect='duckdb')})"
        if label in self.index:
            return self.index[label]
        parts = tuple(self._measure(m) for m in measures)
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
        col = self.scope.measured(arg)
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
