"""What a dataset on another engine may not run, refused from the plan before the charge.

DuckDB gives ``inf``, NaN or NULL where PostgreSQL and Spark's ANSI mode raise
(a double that overflows, a division by zero). A failure after the charge that
depends on the rows would tell the analyst about them, so a dataset on another
engine accepts only arithmetic that stays finite whatever the rows hold. DP
quantiles read DuckDB's ``histogram`` (a MAP), which no other engine has yet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sqlglot import exp

from dpsql.engines.base import unwrap
from dpsql.errors import QueryRejected
from dpsql.query.model import QueryPlan

#: Operators on doubles that PostgreSQL and Spark (ANSI mode) raise on (overflow, division
#: by zero) where DuckDB gives inf, NaN or NULL: an error after the charge would depend on
#: the rows.
_RAISING = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Pow)
_SAFE = 1e300  # a double below this in magnitude is far from overflowing
_INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "INT", "INT2", "INT4", "INT8")


def check_total(plan: QueryPlan, types: Mapping[str, str]) -> None:
    """Refuse what another engine could raise on or cannot run (before the charge).

    A DP quantile reads each group's histogram of grid positions, which dpsql
    computes with DuckDB's ``histogram`` (a MAP): it is refused here, from the plan
    alone, at no cost. dpsql's own arithmetic works on clamped values and cannot
    overflow; an analyst's ``WHERE`` or ``FILTER`` could (``x * 1e300``,
    ``a / (b - 40)``), and a failure that depends on the rows must not happen once
    the query is charged. Arithmetic is allowed where every step stays below 1e300
    whatever the rows: integer columns, literals, and division by a nonzero literal.
    """
    engine = plan.dataset.engine.product if plan.dataset.engine else "DuckDB"
    if any(m.kind == "quantile" for m in plan.measures):
        raise QueryRejected(
            f"dataset {plan.dataset.name} has its rows in {engine}, where dpsql has no DP "
            "quantile (MEDIAN, PERCENTILE_CONT, QUANTILE_CONT, MIN, MAX) yet",
            construct="quantile", advice="estimate it from a histogram: GROUP BY "
            "dp_bin(col, WIDTH) with COUNT(*), or copy the table into a DuckDB dataset")
    for condition in [plan.where, *(m.filter for m in plan.measures)]:
        for node in condition.find_all(*_RAISING) if condition is not None else ():
            if not _magnitude(node, types) < _SAFE:
                raise QueryRejected(
                    f"{node.sql(dialect='duckdb')} could overflow or divide by zero on dataset "
                    f"{plan.dataset.name}, whose rows are in {engine} (it raises there where "
                    "DuckDB does not)", construct="arithmetic",
                    advice="use integer columns, literals and division by a nonzero literal, "
                    "or compare the column itself (x > 10 instead of x * 2 > 20)")


def _magnitude(node: exp.Expr, types: Mapping[str, str]) -> float:
    """An upper bound of ``|node|`` over every row (inf: none is known)."""
    node = unwrap(node)
    if isinstance(node, exp.Literal) and not node.is_string:
        return abs(float(node.this))
    if isinstance(node, (exp.Neg, exp.Abs, exp.Round, exp.Cast, exp.Floor, exp.Ceil)):
        return _magnitude(node.this, types) + 1  # + 1: rounding up
    if isinstance(node, exp.Column):
        kind = types.get(node.name, "").upper()
        return 2.0**64 if kind in _INTEGERS else math.inf
    if isinstance(node, (exp.Add, exp.Sub)):
        return _magnitude(node.this, types) + _magnitude(node.expression, types)
    if isinstance(node, exp.Mul):
        a, b = _magnitude(node.this, types), _magnitude(node.expression, types)
        return 0.0 if 0.0 in (a, b) else a * b
    if isinstance(node, exp.Div):
        divisor = unwrap(node.expression)
        if isinstance(divisor, exp.Cast):
            divisor = unwrap(divisor.this)
        if isinstance(divisor, exp.Literal) and not divisor.is_string \
                and float(divisor.this) != 0:
            return _magnitude(node.this, types) / abs(float(divisor.this))
    return math.inf
