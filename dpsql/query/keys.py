"""Public key sets for GROUP BY, from the policy alone (never from the data).

A key set lists every group a query's answer has a row for, empty groups
included, so the set of rows leaks nothing. Three kinds of key are public:

- a **categorical column**: its declared values (plus NULL when declared);
- an **integer column whose policy bins are single values** (``bins: 1``):
  every integer in its bounds;
- a **binning macro** over a bounded numeric column: ``dp_bin(col, width)``
  gives bins ``[k*width, (k+1)*width)`` keyed by their lower edge, for every
  ``k`` from ``floor(lo/width)`` to ``floor(hi/width)`` (values are clamped
  into the bounds first); ``dp_bin(col)`` gives the policy's own bins, keyed
  by lower edge. Both are defined from public things only (the literal width
  and the declared bounds), so any positive width is accepted.
"""

from __future__ import annotations

import math
from typing import Any

from sqlglot import exp

from dpsql.policy import Column
from dpsql.query.dialect import reject
from dpsql.query.model import GroupKey

#: Largest number of cells (product of key set sizes) a query may have.
MAX_CELLS = 1_000_000


def _with_null(col: Column, values: list[Any]) -> tuple[Any, ...]:
    return (*values, None) if col.nullable else tuple(values)


def value_key(col: Column, source: str, node: exp.Expr) -> GroupKey:
    """GROUP BY ``col`` itself: its public values, or a rejection saying what to write."""
    if col.type == "categorical":
        return GroupKey(col.name, "value", _with_null(col, [v for v in col.values or ()
                                                            if v is not None]))
    if col.numeric and col.edges is not None and col.type == "integer" and all(
            b - a == 1 for a, b in zip(col.edges, col.edges[1:], strict=False)):
        return GroupKey(col.name, "value",
                        _with_null(col, [int(e) for e in col.edges[:-1]]))
    if col.numeric and col.bounds is not None:
        if col.edges is not None:
            advice = (f"group by bins: dp_bin({col.name}) for the policy's bins, or "
                      f"dp_bin({col.name}, WIDTH)")
        else:
            advice = f"group by bins of the bounds: dp_bin({col.name}, WIDTH)"
        raise reject(source, f"column {col.name!r} has no public list of values", node,
                     construct=f"GROUP BY {col.name}", advice=advice)
    raise reject(source, f"column {col.name!r} has no public domain to group by", node,
                 construct=f"GROUP BY {col.name}",
                 advice="group by a categorical column or a dp_bin() of a bounded column")


def policy_bins_key(col: Column, source: str, node: exp.Expr) -> GroupKey:
    """``dp_bin(col)``: the policy's bins of ``col``, keyed by their lower edge."""
    if not col.numeric or col.edges is None:
        raise reject(source, f"column {col.name!r} has no bins in the policy", node,
                     construct="dp_bin", advice=f"give a width: dp_bin({col.name}, WIDTH)"
                     if col.numeric else "dp_bin needs a numeric column with bounds")
    lows: list[Any] = [int(e) if col.type == "integer" else float(e) for e in col.edges[:-1]]
    return GroupKey(col.name, "policy_bins", _with_null(col, lows))


def width_key(col: Column, width_node: exp.Expr, source: str, node: exp.Expr) -> GroupKey:
    """``dp_bin(col, width)``: bins of ``width`` over the bounds of ``col``."""
    if not col.numeric or col.bounds is None:
        raise reject(source, f"dp_bin needs a numeric column with bounds; {col.name!r} has "
                     "none", node, construct="dp_bin",
                     advice="group a categorical column by itself")
    width = _width(width_node, source, col)
    lo, hi = col.bounds
    if not math.isfinite(hi / width - lo / width):
        raise reject(source, f"dp_bin({col.name}, {width:g}) makes too many groups", node,
                     construct="dp_bin", advice=f"use a wider bin (at most {MAX_CELLS:,} groups)")
    first, last = math.floor(lo / width), math.floor(hi / width)
    count = last - first + 1
    if count > MAX_CELLS:
        raise reject(source, f"dp_bin({col.name}, {width:g}) makes {count:,} groups", node,
                     construct="dp_bin", advice=f"use a wider bin (at most {MAX_CELLS:,} groups)")
    if isinstance(width, int):
        values: list[Any] = [k * width for k in range(first, last + 1)]
    else:
        values = [float(k * width) for k in range(first, last + 1)]
    return GroupKey(col.name, "width", _with_null(col, values), width=width)


def _width(node: exp.Expr, source: str, col: Column) -> float | int:
    if not (isinstance(node, exp.Literal) and not node.is_string):
        raise reject(source, "the width of dp_bin must be a positive number", node,
                     construct="dp_bin", advice=f"write dp_bin({col.name}, 10)")
    try:
        value = float(node.this)
    except ValueError:
        raise reject(source, "the width of dp_bin must be a positive number", node,
                     construct="dp_bin", advice=f"write dp_bin({col.name}, 10)") from None
    if not math.isfinite(value) or value <= 0:
        raise reject(source, "the width of dp_bin must be a positive number", node,
                     construct="dp_bin", advice=f"write dp_bin({col.name}, 10)")
    if col.type == "integer":
        if value != int(value):
            raise reject(source, f"{col.name!r} is an integer column: give dp_bin an integer "
                         "width", node, construct="dp_bin",
                         advice=f"write dp_bin({col.name}, {max(1, round(value))})")
        return int(value)
    return value


def check_cells(keys: list[GroupKey], source: str, node: exp.Expr | None) -> None:
    """Refuse a key set product larger than MAX_CELLS (the answer would be that many rows)."""
    cells = math.prod(k.size for k in keys)
    if cells > MAX_CELLS:
        raise reject(source, f"GROUP BY {', '.join(k.column for k in keys)} has {cells:,} "
                     "public groups", node, construct="GROUP BY",
                     advice=f"group by fewer or coarser keys (at most {MAX_CELLS:,} groups); "
                     "every public group gets a row")
