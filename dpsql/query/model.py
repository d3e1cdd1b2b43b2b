"""The QueryPlan: what a validated DP query measures and how its answer is post-processed.

A plan separates three layers. **Measures** are the noisy vectors the query
pays for (a count or a bounded sum over every public cell). **Aggregates** are
what the analyst wrote (COUNT, SUM, AVG) computed from measures: AVG uses two.
**Outputs**, HAVING, ORDER BY and LIMIT are post-processing over the noisy
aggregates and the public keys, so they cost nothing. Post-processing
expressions refer to key ``i`` as column ``_k{i}`` and aggregate ``j`` as
``_a{j}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.optimizer.simplify import simplify_parens

from dpsql.policy import Column, Dataset

KeyMode = Literal["value", "policy_bins", "width", "selected"]
MeasureKind = Literal["count", "distinct", "sum", "centered_sum", "centered_squares", "quantile"]
AggregateFunc = Literal["count", "count_distinct", "sum", "avg", "var_pop", "var_samp",
                        "stddev_pop", "stddev_samp", "median", "min", "max", "quantile"]
#: The counts: integers of sensitivity ``max_rows``, possibly negative once noisy.
COUNTS = ("count", "count_distinct")
#: The aggregates of the spread family: one function of three measures (see :class:`Aggregate`).
SPREAD = ("var_pop", "var_samp", "stddev_pop", "stddev_samp")
#: The DP quantiles: one quantile measure each (see :mod:`dpsql.query.quantile`).
QUANTILES = ("median", "min", "max", "quantile")


@dataclass(frozen=True)
class GroupKey:
    """One GROUP BY key with its full public key set (``values``, in code order).

    ``value``: the column's public values (categorical, or integer bins of
    width 1). ``policy_bins``: the policy's bins, keyed by lower edge.
    ``width``: ``dp_bin(col, width)``, bins ``[k*width, (k+1)*width)`` over
    the column's bounds, keyed by lower edge. ``selected``: a categorical
    column with no value list; ``values`` is empty until DP partition
    selection has released keys (:mod:`dpsql.query.selection`). ``None`` in
    ``values`` is the NULL key of a nullable column.
    """

    column: str
    mode: KeyMode
    values: tuple[Any, ...]
    width: float | int | None = None

    @property
    def size(self) -> int:
        """Number of public keys."""
        return len(self.values)

    def signature(self) -> list[Any]:
        """What identifies the key set (for the normalized plan)."""
        return [self.column, self.mode, self.width]


@dataclass(frozen=True)
class Measure:
    """A noisy vector over all cells: a count, a clamped or centred sum, squares, a quantile.

    ``distinct`` counts the distinct non-NULL values of ``column`` in each cell
    (one row adds at most one, so it has a count's sensitivity). The centred sum
    adds ``value - midpoint of the bounds`` (for AVG and the spread family), the
    centred squares ``(value - midpoint)**2`` (for the spread family); ``column``
    None is COUNT(*); ``filter`` is a FILTER row predicate; ``q`` the quantile of a
    quantile measure (its noisy vector holds grid positions, see
    :mod:`dpsql.query.quantile`).
    """

    kind: MeasureKind
    column: str | None
    filter: exp.Expr | None = None
    q: Fraction | None = None

    def signature(self) -> list[Any]:
        """What identifies the measure (two equal signatures measure the same thing)."""
        where = self.filter.sql(dialect="duckdb") if self.filter is not None else None
        if self.q is not None:
            return [self.kind, self.column, where, str(self.q)]
        return [self.kind, self.column, where]

    def __hash__(self) -> int:
        return hash(json.dumps(self.signature()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Measure) and self.signature() == other.signature()


@dataclass(frozen=True)
class Aggregate:
    """An aggregate the analyst wrote, computed from ``measures`` (indexes into the plan's).

    COUNT, COUNT(DISTINCT) and SUM use one measure; AVG two (centred sum, count); VAR_POP,
    VAR_SAMP, STDDEV_POP and STDDEV_SAMP three (centred squares, centred sum, count);
    a quantile (MEDIAN, MIN, MAX, ``quantile``) one quantile measure.
    """

    func: AggregateFunc
    column: str | None
    measures: tuple[int, ...]
    label: str

    @property
    def default_name(self) -> str:
        """The output name when the query gives none: count, sum_x, count_distinct_x."""
        if self.func == "count" and self.column is None:
            return "count"
        return f"{self.func}_{self.column}"


@dataclass(frozen=True)
class Output:
    """One output column: its name and a post-processing expression over ``_k``/``_a``.

    ``aggregate`` is set when the column is a bare aggregate (it then gets CI columns).
    """

    name: str
    expr: exp.Expr
    aggregate: int | None = None
    key: int | None = None


@dataclass(frozen=True)
class Order:
    """One ORDER BY item over the post-processing columns."""

    expr: exp.Expr
    desc: bool = False
    nulls_first: bool | None = None


@dataclass(frozen=True)
class Join:
    """The dataset joined to public table ``table`` on ``dataset.on = table.key``.

    The key is unique in the table, so each private row matches at most one public
    row: every measure keeps its sensitivity. ``inner``: rows without a match are
    dropped (a row-level filter); otherwise they keep NULL public columns. Public
    columns are named ``<table>.<column>`` in the plan; ``keys`` holds those the
    query groups by, their values read from the public table.
    """

    table: str
    key: str
    on: str
    inner: bool
    columns: tuple[str, ...]
    keys: tuple[Column, ...] = ()

    def signature(self) -> list[Any]:
        """What identifies the join, the public key sets included (for the normalized plan)."""
        return [self.table, self.key, self.on, self.inner,
                [[c.name, list(c.values or ()), c.nullable] for c in self.keys]]


@dataclass(frozen=True)
class QueryPlan:
    """A validated DP query over one dataset."""

    dataset: Dataset
    keys: tuple[GroupKey, ...]
    measures: tuple[Measure, ...]
    aggregates: tuple[Aggregate, ...]
    where: exp.Expr | None
    outputs: tuple[Output, ...]
    having: exp.Expr | None = None
    order: tuple[Order, ...] = ()
    limit: int | None = None
    offset: int | None = None
    options: Mapping[str, str] | None = None
    join: Join | None = None

    def column(self, name: str) -> Column:
        """A column of the dataset, or a public column of the join (``<table>.<column>``)."""
        if self.join is not None:
            for col in self.join.keys:
                if col.name == name:
                    return col
        return self.dataset.column(name)

    @property
    def cells(self) -> int:
        """Number of public cells (product of the key set sizes; 1 without GROUP BY)."""
        return math.prod(k.size for k in self.keys)

    @cached_property
    def key_arrays(self) -> tuple[pa.Array, ...]:
        """The public key value of every cell, per key (first key slowest).

        Public, so built once per plan: a repeated query reuses its plan.
        """
        cells, stride = self.cells, self.cells
        if cells == 0:  # partition selection released no key: no rows
            return tuple(pa.array(list(key.values)).slice(0, 0) for key in self.keys)
        arrays = []
        for key in self.keys:
            stride //= key.size
            codes = (np.arange(cells, dtype=np.int64) // stride) % key.size
            arrays.append(pa.array(list(key.values)).take(pa.array(codes)))
        return tuple(arrays)

    def normalized(self) -> str:
        """The measurement part of the plan as canonical text.

        Two plans with the same text measure the same thing; post-processing
        (outputs, HAVING, ORDER BY, LIMIT) is not part of it.
        """
        return self._normalized

    @cached_property
    def _normalized(self) -> str:
        return json.dumps({
            "dataset": self.dataset.name,
            "keys": [k.signature() for k in self.keys],
            "measures": [m.signature() for m in self.measures],
            "where": canonical_sql(self.where) if self.where is not None else None,
            **({"join": self.join.signature()} if self.join is not None else {}),
        }, sort_keys=True, default=str)


def canonical_sql(node: exp.Expr) -> str:
    """``node`` as DuckDB SQL without redundant parentheses: ``(a = 1)`` and ``a = 1`` agree.

    The shorter text is used only if it parses back to the same tree (parentheses
    aside), so two conditions share a text only when they are the same condition.
    """
    text = node.sql(dialect="duckdb")
    if node.find(exp.Paren) is None:
        return text
    try:
        shorter = text
        for _ in range(64):  # one layer of parentheses a pass, on a fresh tree each time
            tree = sqlglot.parse_one(shorter, read="duckdb").transform(
                lambda n: simplify_parens(n, "duckdb") if isinstance(n, exp.Paren) else n)
            if tree.sql(dialect="duckdb") == shorter:
                break
            shorter = tree.sql(dialect="duckdb")
        same = _bare(sqlglot.parse_one(shorter, read="duckdb")) == _bare(node)
    except (sqlglot.errors.SqlglotError, RecursionError):
        return text
    return shorter if same else text


def _bare(node: exp.Expr) -> exp.Expr:
    """``node`` with every parenthesis node removed (the tree keeps the grouping)."""
    tree = node.copy()
    for paren in list(tree.find_all(exp.Paren)):
        paren.replace(paren.this)
    while isinstance(tree, exp.Paren):  # a root is not replaced in place
        tree = tree.this
    return tree
