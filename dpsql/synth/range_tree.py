"""``range``: a DP hierarchical histogram of one or two numeric columns for range queries.

A flat noisy histogram answers a range of w bins with noise growing like
sqrt(w) (the book's observation that wide ranges get no more accurate). A tree
of noisy counts (each level a coarser histogram) lets any range be covered by
O(b log_b n) nodes per side; least-squares consistency (Hay et al. 2010,
generalised to per-node variances) then makes every node equal the sum of its
children, and the consistent leaves answer any range with error growing only
polylogarithmically in the number of bins. The leaves are released as a table
that the ``udfs.dp_range_count`` macros read for free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError, ReleaseError
from dpsql.privacy import PrivacyCost
from dpsql.progress import Progress, silent
from dpsql.synth.base import register
from dpsql.synth.histogram import probabilities
from dpsql.synth.measure import count_marginals, measure_counts

MAX_LEAVES = 4_000_000


def aggregate(values: np.ndarray, factor: int) -> np.ndarray:
    """Sum blocks of ``factor`` cells along every axis (children -> parents)."""
    shape: list[int] = []
    for size in values.shape:
        shape += [size // factor, factor]
    return values.reshape(shape).sum(axis=tuple(range(1, 2 * values.ndim, 2)))


def expand(values: np.ndarray, factor: int) -> np.ndarray:
    """Repeat every cell ``factor`` times along every axis (parents -> children)."""
    for axis in range(values.ndim):
        values = np.repeat(values, factor, axis=axis)
    return values


def consistent_tree(measured: list[np.ndarray], variances: list[np.ndarray],
                    branching: int) -> list[np.ndarray]:
    """Least-squares estimates of every level of a tree of noisy counts.

    ``measured[l]`` holds level l (root first, leaves last; each axis grows by
    ``branching`` per level) and ``variances[l]`` its noise variances (0: known
    exactly, e.g. padding). Two passes, exact for independent noise: bottom-up,
    each node combines its own measurement with its children's estimates by
    inverse variance; top-down, each parent's final value is split over its
    children in proportion to their variances (Hay et al. 2010, Sec. 4, with
    unequal variances). Post-processing only.
    """
    z = [np.asarray(m, dtype=np.float64) for m in measured]
    v = [np.asarray(x, dtype=np.float64) for x in variances]
    children_sum: list[np.ndarray] = [np.empty(0)] * len(z)
    children_var: list[np.ndarray] = [np.empty(0)] * len(z)
    for level in range(len(z) - 2, -1, -1):
        cz = aggregate(z[level + 1], branching)
        cv = aggregate(v[level + 1], branching)
        children_sum[level], children_var[level] = cz, cv
        y, s = z[level], v[level]
        denominator = np.where(s + cv > 0, s + cv, 1.0)
        z[level] = np.where(s == 0, y, np.where(cv == 0, cz, (y * cv + cz * s) / denominator))
        v[level] = np.where((s == 0) | (cv == 0), 0.0, s * cv / denominator)
    final = [z[0]]
    for level in range(len(z) - 1):
        gap = final[level] - children_sum[level]
        cv = children_var[level]
        weight = v[level + 1] / expand(np.where(cv > 0, cv, 1.0), branching)
        final.append(z[level + 1] + expand(gap, branching) * weight)
    return final


@dataclass
class FittedRangeTree:
    """Consistent leaf counts of the tree; a representation for range queries.

    Everything it holds is DP (noisy counts, post-processed).
    """

    domain: Domain
    leaves: np.ndarray  # consistent counts over the real bins (NULL excluded)
    rows: int
    spent: PrivacyCost
    branching: int
    levels: int
    measurements: list[dict[str, Any]]

    def representation(self) -> pa.Table:
        """The released table: one row per leaf bin with its value range and count."""
        columns: dict[str, Any] = {}
        grids = np.meshgrid(*[np.arange(s) for s in self.leaves.shape], indexing="ij")
        for axis, (attribute, grid) in enumerate(zip(self.domain.attributes, grids)):
            suffix = "" if axis == 0 else str(axis + 1)
            codes = grid.ravel()
            edges = np.asarray(attribute.column.edges, dtype=np.float64)
            labels = attribute.labels()
            columns[f"bin{suffix}"] = pa.array(codes.astype(np.int32))
            columns[f"label{suffix}"] = pa.array([labels[c] for c in codes])
            columns[f"lo{suffix}"] = pa.array(edges[codes])
            columns[f"hi{suffix}"] = pa.array(edges[codes + 1])
        columns["count"] = pa.array(self.leaves.ravel())
        return pa.table(columns)

    def sample(self, n: int, rng: np.random.Generator) -> pa.Table:
        """``n`` rows of codes drawn from the leaves (negatives clipped); never NULL."""
        table = probabilities(self.leaves, "clip", self.rows)
        flat = rng.choice(table.size, size=n, p=table.ravel())
        codes = np.unravel_index(flat, table.shape)
        return pa.table({a.name: c.astype(np.int32)
                         for a, c in zip(self.domain.attributes, codes)})

    def describe(self) -> dict[str, Any]:
        """Tree shape, per-level noise (no counts)."""
        return {
            "parameters": {"branching": self.branching, "levels": self.levels},
            "measurements": self.measurements,
            "diagnostics": {"leaves": int(self.leaves.size), "row_estimate": self.rows,
                            "consistency": "least squares (Hay et al. 2010)",
                            "warnings": []},
        }


@register("range")
@dataclass
class RangeTree:
    """A DP tree histogram of one or two numeric columns, answering any range query.

    Options: ``branching`` (children per node along each axis; default 16 for
    one column and 4 for two, near the optimum of Qardaji, Yang & Li 2013).
    The release is the table of consistent leaf counts, not rows; query it
    with ``udfs.dp_range_count(release, lo, hi)`` (and ``dp_range_count2``).

    Privacy: each tree level partitions the bounded rows (L1 and L2
    sensitivity max_rows); the levels compose sequentially with equal budget
    shares; Laplace under pure DP, Gaussian under zCDP. Padding cells beyond
    the policy's bins are known to be empty and get no noise. Consistency is
    post-processing. Hay, Rastogi, Miklau & Suciu, VLDB 2010.
    """

    name: ClassVar[str] = "range"
    is_dp: ClassVar[bool] = True
    output: ClassVar[str] = "representation"
    branching: int | None = None

    def __post_init__(self) -> None:
        if self.branching is not None and self.branching < 2:
            raise ConfigurationError(f"branching must be at least 2, got {self.branching}")

    def _branching(self, domain: Domain) -> int:
        return self.branching or (16 if len(domain) == 1 else 4)

    def check(self, domain: Domain, budget: PrivacyCost) -> None:
        """One or two numeric columns with bins, and a tree of reasonable size."""
        if len(domain) not in (1, 2):
            raise ConfigurationError(
                f"range takes one or two numeric columns, got {len(domain)}: pass "
                "--columns age (or --columns age,hours_per_week)")
        for attribute in domain.attributes:
            if not attribute.column.numeric:
                raise ConfigurationError(
                    f"range needs numeric columns; {attribute.name!r} is "
                    f"{attribute.column.type}: use the independent or joint synthesizer")
        side = self._branching(domain) ** _height(domain, self._branching(domain))
        if side ** len(domain) > MAX_LEAVES:
            raise ReleaseError(f"the padded tree would have {side ** len(domain):,} leaves; "
                               "use coarser bins in the policy or a smaller branching")

    def fit(self, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
            rng: np.random.Generator, progress: Progress | None = None) -> FittedRangeTree:
        """Count the leaves in DuckDB, noise every level, make the tree consistent."""
        self.check(domain, budget)
        report = progress or silent
        b = self._branching(domain)
        height = _height(domain, b)
        side = b**height
        bins = tuple(a.bins for a in domain.attributes)
        real = tuple(slice(0, s) for s in bins)
        exact = np.zeros((side,) * len(domain), dtype=np.int64)
        exact[real] = count_marginals(source, domain, [domain.names])[0][real]
        mask = np.zeros(exact.shape, dtype=bool)
        mask[real] = True
        costs = budget.split([1] * (height + 1))
        measured, variances, descriptors = [], [], []
        spent = PrivacyCost.zero(budget.kind)
        for level, cost in enumerate(costs):
            report("measure", level, height + 1)
            factor = b ** (height - level)
            counts = aggregate(exact, factor)
            inside = aggregate(mask.astype(np.int64), factor) > 0
            noisy = measure_counts((f"level {level}",), counts[inside], cost, domain.max_rows)
            y = np.zeros(counts.shape)
            y[inside] = noisy.noisy
            var = np.zeros(counts.shape)
            var[inside] = noisy.variance
            measured.append(y)
            variances.append(var)
            spent = spent + noisy.cost
            descriptors.append({**noisy.describe(), "level": level,
                                "columns": list(domain.names)})
        report("measure", height + 1, height + 1)
        tree = consistent_tree(measured, variances, b)
        leaves = tree[-1][real]
        rows = max(1, round(float(tree[0].sum())))
        return FittedRangeTree(domain, leaves, rows, spent, b, height + 1, descriptors)


def _height(domain: Domain, branching: int) -> int:
    """Levels below the root so that branching**height covers every axis's bins."""
    widest = max(a.bins for a in domain.attributes)
    height = 1
    while branching**height < widest:
        height += 1
    return height
