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

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError, ReleaseError
from dpsql.privacy import PrivacyCost
from dpsql.progress import Progress, silent
from dpsql.synth.forecast import Forecast, Planned, baseline, noise_sd
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


# -- choosing the branching factor (public arithmetic: bins and accounting only) --------------

MAX_EXACT_LEAVES = 512  # above this, a fixed branching instead of the exact comparison
CANDIDATES = (0, 2, 3, 4, 8, 16)  # 0: no tree, one flat noisy histogram


def tree_height(bins: tuple[int, ...], branching: int) -> int:
    """Levels below the root so that branching**height covers every axis (0: flat)."""
    if branching == 0:
        return 0
    height = 1
    while branching**height < max(bins):
        height += 1
    return height


def level_variance(levels: int, kind: str) -> float:
    """Noise variance of one tree level, in units of a flat histogram cell's at the same budget.

    An equal split over L levels multiplies the variance by L under zCDP (rho
    splits) and by L^2 under pure DP (epsilon splits).
    """
    return float(levels if kind == "zcdp" else levels**2)


def leaf_information(bins: tuple[int, ...], branching: int, weights: list[float]) -> np.ndarray:
    """``A^T W A`` over the real leaves (row-major): the consistent leaves' inverse covariance.

    Level l (root first) has noise variance 1 / weights[l].
    """
    height = len(weights) - 1
    grids = np.meshgrid(*[np.arange(n) for n in bins], indexing="ij")
    coords = [g.ravel() for g in grids]
    information = np.zeros((coords[0].size, coords[0].size))
    for level, weight in enumerate(weights):
        factor = branching ** (height - level)
        node = np.zeros(coords[0].size, dtype=np.int64)
        for c, n in zip(coords, bins, strict=True):
            node = node * n + c // factor
        information += weight * np.equal.outer(node, node)
    return information


def range_weights(bins: tuple[int, ...]) -> np.ndarray:
    """For every pair of leaves (row-major), how many axis-aligned ranges contain both."""
    weight = np.ones((1, 1))
    for n in bins:
        i = np.arange(n)
        weight = np.kron(weight, (np.minimum.outer(i, i) + 1) * (n - np.maximum.outer(i, i)))
    return weight


@functools.lru_cache(maxsize=256)
def average_range_variance(bins: tuple[int, ...], branching: int, kind: str) -> float:
    """Mean variance of a range count over all ranges, relative to a flat histogram's mean.

    Exact: the consistent tree is the least-squares estimate, whose covariance is
    the inverse of :func:`leaf_information`.
    """
    levels = tree_height(bins, branching) + 1
    per_level = level_variance(levels, kind)
    covariance = np.linalg.inv(leaf_information(bins, branching, [1 / per_level] * levels))
    weight = range_weights(bins)
    return float((covariance * weight).sum() / np.trace(weight))


@functools.lru_cache(maxsize=256)
def choose_branching(bins: tuple[int, ...], kind: str) -> int:
    """The branching factor (0: flat) with the smallest mean range variance.

    Exact up to MAX_EXACT_LEAVES leaves; beyond, the factor that wins at that
    size (2 under zCDP; 8, or 4 per axis for two columns, under pure DP).
    """
    if math.prod(bins) > MAX_EXACT_LEAVES:
        return 2 if kind == "zcdp" else (8 if len(bins) == 1 else 4)
    scores = {b: average_range_variance(bins, b, kind) for b in CANDIDATES
              if (b ** tree_height(bins, b)) ** len(bins) <= MAX_LEAVES}
    return min(scores, key=lambda b: (scores[b], b))


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
    relative_variance: float | None = None  # mean range variance / a flat histogram's

    def representation(self) -> pa.Table:
        """The released table: one row per leaf bin with its value range and count."""
        columns: dict[str, Any] = {}
        grids = np.meshgrid(*[np.arange(s) for s in self.leaves.shape], indexing="ij")
        for axis, (attribute, grid) in enumerate(zip(self.domain.attributes, grids, strict=True)):
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
                         for a, c in zip(self.domain.attributes, codes, strict=True)})

    def describe(self) -> dict[str, Any]:
        """Tree shape, per-level noise (no counts)."""
        return {
            "parameters": {"branching": self.branching, "levels": self.levels},
            "measurements": self.measurements,
            "diagnostics": {"leaves": int(self.leaves.size), "row_estimate": self.rows,
                            "consistency": "least squares (Hay et al. 2010)",
                            "mean_range_variance_vs_flat_histogram": self.relative_variance,
                            "warnings": []},
        }


def noisy_tree(exact: np.ndarray, branching: int, budget: PrivacyCost, sensitivity: int,
               progress: Progress | None = None) -> tuple[np.ndarray, PrivacyCost,
                                                           list[dict[str, Any]]]:
    """Consistent leaf estimates of the exact leaf counts ``exact`` (one axis per column).

    Privacy: each level is a partition of the rows (sensitivity ``sensitivity``);
    levels get equal shares of ``budget`` and compose to at most it. Returns the
    leaves, the cost spent and one descriptor per level (no counts).
    """
    report = progress or silent
    bins = exact.shape
    height = tree_height(bins, branching)
    real = tuple(slice(0, n) for n in bins)
    shape = bins if height == 0 else (branching**height,) * exact.ndim
    padded = np.zeros(shape, dtype=np.int64)
    padded[real] = exact
    mask = np.zeros(padded.shape, dtype=np.int64)
    mask[real] = 1
    measured, variances, descriptors = [], [], []
    spent = PrivacyCost.zero(budget.kind)
    for level, cost in enumerate(budget.split([1] * (height + 1))):
        report("measure", level, height + 1)
        factor = branching ** (height - level)
        counts = aggregate(padded, factor)
        inside = aggregate(mask, factor) > 0  # padding-only nodes are known to be empty
        noisy = measure_counts((f"level {level}",), counts[inside], cost, sensitivity)
        y = np.zeros(counts.shape)
        y[inside] = noisy.noisy
        var = np.zeros(counts.shape)
        var[inside] = noisy.variance
        measured.append(y)
        variances.append(var)
        spent = spent + noisy.cost
        descriptors.append({**noisy.describe(), "level": level})
    report("measure", height + 1, height + 1)
    return consistent_tree(measured, variances, branching)[-1][real], spent, descriptors


@dataclass
class RangeTree:
    """A DP tree histogram of one or two numeric columns, answering any range query.

    Options: ``branching`` (children per node along each axis, 0 for a flat
    histogram); by default the one of 0, 2, 3, 4, 8, 16 with the smallest mean
    variance over all ranges, computed exactly from the bins and the accounting
    (public facts): small domains under pure DP are best served flat. The
    release is the table of consistent leaf counts, not rows; query it with
    ``udfs.dp_range_count(release, lo, hi)`` (and ``dp_range_count2``).

    Privacy: each tree level partitions the bounded rows (L1 and L2
    sensitivity max_rows); the levels compose sequentially with equal budget
    shares; Laplace under pure DP, Gaussian under zCDP. Padding cells beyond
    the policy's bins are known to be empty and get no noise. Consistency is
    post-processing. Hay, Rastogi, Miklau & Suciu, VLDB 2010; Qardaji, Yang &
    Li, VLDB 2013.
    """

    name: ClassVar[str] = "range"
    is_dp: ClassVar[bool] = True
    output: ClassVar[str] = "representation"
    branching: int | None = None

    def __post_init__(self) -> None:
        if self.branching is not None and (self.branching < 0 or self.branching == 1):
            raise ConfigurationError(f"branching must be 0 (flat) or at least 2, got "
                                     f"{self.branching}")

    def _branching(self, domain: Domain, kind: str) -> int:
        if self.branching is not None:
            return self.branching
        return choose_branching(_bins(domain), kind)

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
        b = 2 if self.branching is None else self.branching
        leaves = (b ** tree_height(_bins(domain), b)) ** len(domain) if b else 1
        if leaves > MAX_LEAVES:
            raise ReleaseError(f"the padded tree would have {leaves:,} leaves; use coarser bins "
                               "in the policy or a smaller branching")

    def forecast(self, domain: Domain, budget: PrivacyCost) -> Forecast:
        """Every level of the tree, each a partition of the rows with an equal share."""
        bins = _bins(domain)
        b = self._branching(domain, budget.kind)
        height = tree_height(bins, b)
        levels = height + 1
        sd, mechanism = noise_sd(budget.split([1] * levels)[0], domain.max_rows)
        leaves = math.prod(bins)
        planned = Planned("level of the range tree", levels, leaves, mechanism, sd)
        notes = (f"a range query sums a few nodes per level ({levels} levels, branching {b}); "
                 "the consistent tree then answers any range",)
        return Forecast(self.name, (planned,), domain.public_rows, baseline(domain, budget),
                        notes=notes)

    def fit(self, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
            rng: np.random.Generator, progress: Progress | None = None) -> FittedRangeTree:
        """Count the leaves in DuckDB, noise every level, make the tree consistent."""
        self.check(domain, budget)
        bins = _bins(domain)
        b = self._branching(domain, budget.kind)
        exact = count_marginals(source, domain, [domain.names])[0][tuple(slice(0, n)
                                                                          for n in bins)]
        leaves, spent, levels = noisy_tree(exact, b, budget, domain.max_rows, progress)
        rows = max(1, round(float(leaves.sum())))
        for level in levels:
            level["columns"] = list(domain.names)
        fitted = FittedRangeTree(domain, leaves, rows, spent, b, len(levels), levels)
        if math.prod(bins) <= MAX_EXACT_LEAVES:
            fitted.relative_variance = average_range_variance(bins, b, budget.kind)
        return fitted


def _bins(domain: Domain) -> tuple[int, ...]:
    return tuple(a.bins for a in domain.attributes)
