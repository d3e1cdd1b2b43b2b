r"""DP aggregates: noisy counts of every k-tuple of attribute values, k = 1..R.

This is step (i) of Synthetic Data Showcase (SDS; Microsoft, "DP aggregates and
synthesis"). For each length k the candidates are the k-tuples whose every
(k-1)-sub-tuple survived step k-1 (all domain values for k = 1); each record
counts at most ``s_k`` of its candidate tuples (a DP percentile of the records'
numbers of candidate tuples; the excess is dropped at random); every candidate,
zero counts included, gets discrete Gaussian noise; tuples at or below the
threshold ``tau_k`` are filtered (and so never extend at k+1). Finally counts
are normalized so that no k-tuple exceeds any of its (k-1)-sub-tuples.

Privacy: derivation under dpsql's model (DESIGN.md: neighbours add or remove
one privacy unit, i.e. at most ``m = max_rows`` rows of the bounded source).
The budget is a zCDP ``rho``; its shares are ``rho_N = N_p rho`` (record
count), ``rho_Q = Q_p rho`` (percentiles, ``rho_Q / R`` per length) and
``rho_M = rho - rho_N - rho_Q`` (counts). The SDS text splits an epsilon and
converts ``(eps_M, delta/2)`` to ``rho = (sqrt(eps_M + ln(2/delta)) -
sqrt(ln(2/delta)))^2``; dpsql receives rho from the ledger (the policy converts
(epsilon, delta) with ``ln(1/delta)``) and spends no delta itself, because its
column domains are public: the k = 1 candidates are all domain values, not the
values seen in the data, so SDS's delta-threshold on 1-counts is not needed.

1. Record count ``n``: one unit changes it by at most m. Discrete Gaussian
   noise with ``sigma_N^2 = m^2 / (2 rho_N)`` is ``rho_N``-zCDP (Canonne, Kamath
   & Steinke 2020, Thm 4; :class:`dpsql.mechanisms.gaussian.GaussianMechanism`).
   Skipped, and its share given to the counts, when the policy declares the row
   count public.
2. Percentile at length k: candidates ``t in {0, ..., C(d, k)}`` (d columns: a
   public range). With ``L(t) = #{v_j < t}``, ``R(t) = #{v_j <= t}`` over the
   records' numbers ``v_j`` of candidate k-tuples, the score in hundredths of a
   record is ``u(t) = -max(0, 100 L(t) - p n, p n - 100 R(t))`` (0 exactly at
   the p-th percentile). One record moves L, R by at most 1 and n by 1, so
   ``|Delta u| <= max(p, 100 - p)``, and a unit ``Delta_u = m max(p, 100-p)``.
   Report-noisy-max with discrete Laplace noise of scale b (ties to the
   smallest t) is ``2 Delta_u / b``-DP: the argument of Dwork & Roth 2014,
   Claim 3.9, for non-monotone scores holds for any integer noise whose tail
   ratio under an integer shift s is at least ``e^{-s/b}``, which the discrete
   Laplace satisfies. epsilon-DP implies ``epsilon^2/2``-zCDP (Bun & Steinke
   2016, Prop. 1.4), so ``b = 2 Delta_u / sqrt(2 rho_Q / R)``
   (:class:`dpsql.mechanisms.noisy_max.ReportNoisyMax`).
3. k-tuple counts: after dropping, a record adds 1 to at most ``s_k`` distinct
   candidate tuples; a unit adds at most m to any tuple and at most ``m s_k`` in
   all, so the L2 sensitivity is ``Delta_k = m sqrt(s_k)``
   (``||x||_2^2 <= ||x||_inf ||x||_1``). Which tuples a record keeps depends only
   on its own values, its rank among identical records and a seed (a keyed hash),
   so the other records keep the same tuples in both neighbours: the bound holds
   for every seed, and the seed need not be secret. The candidate set is fixed
   by earlier DP outputs and every candidate is noised. Noise with
   ``sigma_k^2 = Delta_k^2 / (2 rho_k)`` is ``rho_k``-zCDP. SDS fixes the ratios of
   the noise per sensitivity unit, ``sigma_k / Delta_k = p_k sigma``
   (``sigma_proportions``): then ``rho_k = 1 / (2 p_k^2 sigma^2)`` and
   ``sum_k rho_k = rho_M`` gives ``sigma^2 = sum_k p_k^{-2} / (2 rho_M)``, i.e.
   ``rho_k = rho_M p_k^{-2} / sum_j p_j^{-2}``, independent of the data-chosen s_k.
4. Composition: ``rho_N + sum_k eps_k^2/2 + sum_k rho_k <= rho`` (zCDP composes
   adaptively, Bun & Steinke 2016, Lemma 2.3; each step's parameters depend only
   on earlier DP outputs). Exactness: shares round down, sigma^2 and b round up
   to the samplers' grids, and each cost is recomputed from the scale actually
   used and rounded up, so the reported ``spent`` is the true cost and never
   exceeds the budget.
5. Thresholds, propagation of filtered tuples, normalization, pruning
   (:func:`prune_uncovered`) and synthesis only read DP outputs:
   post-processing.

Adaptive thresholds follow SDS: ``tau_k = std_k Phi^{-1}(1 - eta_k / 2)``, so a
fabricated tuple (true count 0) survives with probability about ``eta_k / 2``;
fixed thresholds are given as counts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from scipy import stats

from dpsql.mechanisms.gaussian import GaussianMechanism
from dpsql.mechanisms.noisy_max import ReportNoisyMax
from dpsql.privacy import PrivacyCost, to_fraction
from dpsql.progress import Progress
from dpsql.synth.sds.tuples import Items, TupleSpace, TupleTable, candidates

CHUNK_CELLS = 2_000_000  # records x column sets enumerated at once


@dataclass(frozen=True)
class Settings:
    """The aggregation parameters (validated by the synthesizer)."""

    reporting_length: int
    percentile: int
    percentile_share: Fraction
    rows_share: Fraction
    sigma_proportions: tuple[float, ...]
    threshold_type: str
    thresholds: tuple[float, ...]
    prune_uncovered: bool = True


@dataclass
class Level:
    """The released k-tuples of one length: sorted item rows and normalized noisy counts."""

    k: int
    rows: np.ndarray
    table: TupleTable


@dataclass
class Aggregates:
    """The DP aggregates, their cost, and JSON-able descriptors of every step."""

    levels: list[Level]
    rows: int
    spent: PrivacyCost
    steps: list[dict[str, Any]] = field(default_factory=list)
    parts: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- budget


Parts = tuple[PrivacyCost | None, list[PrivacyCost], list[PrivacyCost]]


def split_budget(budget: PrivacyCost, settings: Settings, count_rows: bool) -> Parts:
    """Split ``budget`` into the parts of the record count, the percentiles and the counts.

    The record count's part is None when the count is public; there is one
    percentile part per length and one count part per length, proportional to
    1/p_k^2. Shares round down (:meth:`PrivacyCost.split`), so the parts never sum above the budget.
    """
    r = settings.reporting_length
    rows_share = settings.rows_share if count_rows else Fraction(0)
    shares = [rows_share, settings.percentile_share,
              1 - rows_share - settings.percentile_share]
    used = [s for s in shares if s > 0]
    parts = iter(budget.split(tuple(used)))
    rows_part, pct_part, marg_part = (next(parts) if s > 0 else None for s in shares)
    assert pct_part is not None
    assert marg_part is not None
    percentile = pct_part.split([1] * r)
    weights = [1 / to_fraction(p, "sigma proportion") ** 2 for p in settings.sigma_proportions]
    marginals = marg_part.split(tuple(weights))
    return rows_part, percentile, marginals


# --------------------------------------------------------------------------- mechanisms


def gaussian(counts: np.ndarray, sensitivity2: Fraction,
             cost: PrivacyCost) -> tuple[np.ndarray, Fraction, PrivacyCost]:
    """Add discrete Gaussian noise to counts of squared L2 sensitivity ``sensitivity2``.

    Privacy: ``sensitivity2 / (2 sigma^2)``-zCDP; sigma^2 is calibrated to ``cost``
    and rounded up, and the returned cost is recomputed from the sigma^2 used.
    """
    if cost.infinite:
        return counts.astype(np.int64), Fraction(0), PrivacyCost.unbounded("zcdp")
    mechanism = GaussianMechanism.calibrate_squared(sensitivity2, cost).used()
    return mechanism.release(counts.astype(np.int64)), mechanism.sigma2, mechanism.cost()


def percentile_scores(histogram: np.ndarray, percent: int) -> np.ndarray:
    """Score each t as the ``percent``-th percentile of the values counted in ``histogram``.

    In hundredths of a record; 0 at the true percentile (module docstring, step 2).
    """
    hist = np.asarray(histogram, dtype=np.int64)
    n = int(hist.sum())
    at_most = np.cumsum(hist)
    below = at_most - hist
    return -np.maximum(0, np.maximum(100 * below - percent * n, percent * n - 100 * at_most))


def dp_percentile(histogram: np.ndarray, percent: int, max_rows: int,
                  cost: PrivacyCost) -> tuple[int, Fraction, PrivacyCost]:
    """Pick the ``percent``-th percentile of per-record values by report-noisy-max.

    Privacy: scores have sensitivity ``max_rows * max(p, 100-p)`` (module docstring,
    step 2); discrete Laplace report-noisy-max of scale b is ``2 Delta / b``-DP,
    charged as ``(2 Delta / b)^2 / 2``-zCDP (:class:`ReportNoisyMax`). Returns
    (value, scale, cost).
    """
    scores = percentile_scores(histogram, percent)
    if cost.infinite:
        return int(np.argmax(scores)), Fraction(0), PrivacyCost.unbounded("zcdp")
    mechanism = ReportNoisyMax.calibrate(max_rows * max(percent, 100 - percent), cost).used()
    return mechanism.select(scores), mechanism.scale, mechanism.cost("zcdp")


def threshold(settings: Settings, k: int, sigma2: Fraction) -> float:
    """Return the count a k-tuple must exceed to be reported (post-processing)."""
    value = settings.thresholds[k - 1]
    if settings.threshold_type == "fixed":
        return float(value)
    return math.sqrt(sigma2) * float(stats.norm.isf(value / 2))


# --------------------------------------------------------------------------- contributions

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a bijective scramble of uint64 (wraps on purpose)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def record_keys(rows: np.ndarray, seed: int) -> np.ndarray:
    """Hash each record's values and its rank among identical records, with a seed.

    The rank makes identical records draw independently while keeping each
    record's draw a function of the multiset of records (see step 3).
    """
    n = len(rows)
    h = np.full(n, np.uint64(seed & (2**64 - 1)))
    for c in range(rows.shape[1]):
        h = _mix(h ^ (rows[:, c] + 2).astype(np.uint64))
    order = np.lexsort(rows.T[::-1]) if rows.shape[1] else np.arange(n)
    ranked = rows[order]
    new = np.ones(n, dtype=bool)
    new[1:] = np.any(ranked[1:] != ranked[:-1], axis=1)
    starts = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    rank = np.empty(n, dtype=np.uint64)
    rank[order] = (np.arange(n) - starts).astype(np.uint64)
    return _mix(h ^ _mix(rank * _GOLDEN + np.uint64(1)))


def _chunks(n: int, width: int) -> list[slice]:
    step = max(1, CHUNK_CELLS // max(width, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def _positions(rows: np.ndarray, items: Items, table: TupleTable) -> np.ndarray:
    """Table position of each record's tuple on each column set (-1: empty or no candidate)."""
    keys, full = table.space.record_keys(items.to_codes(rows))
    if full.all():
        return table.find(keys)
    out = np.full(full.shape, -1, dtype=np.int64)
    out[full] = table.find(keys[full])
    return out


def valid_histogram(rows: np.ndarray, items: Items, table: TupleTable) -> np.ndarray:
    """How many records have 0, 1, ..., C(d, k) candidate tuples (private)."""
    width = len(table.space.column_sets)
    hist = np.zeros(width + 1, dtype=np.int64)
    for part in _chunks(len(rows), width):
        valid = (_positions(rows[part], items, table) >= 0).sum(axis=1)
        hist += np.bincount(valid, minlength=width + 1)
    return hist


def kept_tuples(rows: np.ndarray, keys: np.ndarray, items: Items, table: TupleTable,
                allowed: int, k: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield, chunk by chunk, (record index, table position) of the tuples records keep.

    Each record keeps at most ``allowed`` of its candidate tuples, chosen by the
    keyed hash of its values (uniformly at random over the seed).
    """
    width = len(table.space.column_sets)
    for part in _chunks(len(rows), width):
        pos = _positions(rows[part], items, table)
        valid = pos >= 0
        if allowed < width:
            salt = np.arange(width, dtype=np.uint64) + np.uint64(k << 32)
            u = _mix(keys[part][:, None] ^ _mix(salt * _GOLDEN)[None, :])
            u = np.where(valid, u, np.iinfo(np.uint64).max)
            chosen = np.zeros_like(valid)
            if allowed > 0:
                idx = np.argpartition(u, allowed - 1, axis=1)[:, :allowed]
                np.put_along_axis(chosen, idx, True, axis=1)
            valid &= chosen
        r, c = np.nonzero(valid)
        yield r + part.start, pos[r, c]


def bounded_counts(rows: np.ndarray, keys: np.ndarray, items: Items, table: TupleTable,
                   allowed: int, k: int) -> np.ndarray:
    """Count each candidate k-tuple over records that keep at most ``allowed`` tuples each."""
    counts = np.zeros(len(table), dtype=np.int64)
    for _, pos in kept_tuples(rows, keys, items, table, allowed, k):
        counts += np.bincount(pos, minlength=len(table))
    return counts


# --------------------------------------------------------------------------- the process


def aggregate(rows: np.ndarray, items: Items, settings: Settings, budget: PrivacyCost,
              max_rows: int, public_rows: int | None, seed: int,
              progress: Progress | None = None) -> Aggregates:
    """Run the DP aggregation on records given as item rows (EMPTY for empty cells)."""
    d = items.columns
    r = min(settings.reporting_length, d)
    rows_part, pct_parts, marg_parts = split_budget(budget, settings, public_rows is None)
    spent = PrivacyCost.zero("zcdp") if not budget.infinite else PrivacyCost.unbounded("zcdp")
    parts: dict[str, Any] = {}
    if public_rows is None:
        assert rows_part is not None
        noisy_n, sigma2_n, cost_n = gaussian(np.array([len(rows)]), Fraction(max_rows**2),
                                             rows_part)
        n_rows = max(1, int(noisy_n[0]))
        spent = spent + cost_n
        parts["record_count"] = {"sigma": math.sqrt(sigma2_n), "cost": cost_n.as_dict()}
    else:
        n_rows = public_rows
        parts["record_count"] = {"declared": public_rows}
    keys = record_keys(rows, seed)
    levels: list[Level] = []
    steps: list[dict[str, Any]] = []
    survivors = np.empty((0, 0), dtype=np.int64)
    previous: TupleTable | None = None
    for k in range(1, r + 1):
        if progress:
            progress("sds: aggregates", k - 1, r)
        cand = candidates(items, survivors, previous)
        step: dict[str, Any] = {"length": k, "candidates": len(cand)}
        steps.append(step)
        if len(cand) == 0:
            break
        space = TupleSpace(items.sizes, k)
        table = TupleTable(space, space.item_keys(items, cand))
        cand = cand[table.order]
        hist = valid_histogram(rows, items, table)
        allowed, scale, cost_q = dp_percentile(hist, settings.percentile, max_rows,
                                               pct_parts[k - 1])
        spent = spent + cost_q
        step.update(allowed_sensitivity=allowed, percentile_scale=float(scale),
                    percentile_cost=cost_q.as_dict())
        if allowed == 0:
            break
        counts = bounded_counts(rows, keys, items, table, allowed, k)
        noisy, sigma2, cost_k = gaussian(counts, Fraction(max_rows**2 * allowed),
                                         marg_parts[k - 1])
        spent = spent + cost_k
        tau = threshold(settings, k, sigma2)
        keep = (noisy > tau) & (noisy > 0)
        step.update(sigma=math.sqrt(sigma2), threshold=tau, cost=cost_k.as_dict(),
                    reported=int(keep.sum()))
        survivors = cand[keep]
        previous = TupleTable(space, space.item_keys(items, survivors), noisy[keep])
        survivors = survivors[previous.order]
        levels.append(Level(k, survivors, previous))
        if len(survivors) == 0:
            break
    if progress:
        progress("sds: aggregates", r, r)
    normalize(levels, items)
    if settings.prune_uncovered:
        for step, dropped in zip(steps[1:], prune_uncovered(levels, items), strict=False):
            step["uncovered"] = dropped
    return Aggregates(levels, n_rows, spent, steps, parts)


def normalize(levels: list[Level], items: Items) -> None:
    """Clip each k-tuple's count to the smallest count of its (k-1)-sub-tuples (in place).

    Levels are processed in order of length, so the clipped counts propagate.
    Every sub-tuple is present: candidates were built from survivors only.
    """
    for prev, level in itertools.pairwise(levels):
        if len(level.rows) == 0:
            continue
        smallest = np.full(len(level.rows), np.inf)
        for j in range(level.k):
            sub = np.delete(level.rows, j, axis=1)
            pos = prev.table.find(prev.table.space.item_keys(items, sub))
            assert np.all(pos >= 0), "a released tuple lost a sub-tuple"
            smallest = np.minimum(smallest, prev.table.values[pos])
        level.table.values = np.minimum(level.table.values, smallest).astype(np.int64)


def prune_uncovered(levels: list[Level], items: Items) -> list[int]:
    """Drop the k-tuples (k >= 2) that none of their (k-1)-sub-tuples covers (in place).

    The records holding a (k-1)-tuple u and a value in column c split u's count
    among u's extensions into c, so those extensions' true counts sum to at
    most count(u) (exactly so without contribution bounding; the noise and the
    per-length bounds make it approximate). Ranked by noisy count, the
    extensions that come after others already summing to count(u) are the
    likeliest to be noise: a tuple is *covered* by u when the extensions with a
    larger count sum to less than count(u) (ties rank together). A tuple is
    kept when at least one of its sub-tuples covers it; a longer tuple is
    dropped with any sub-tuple dropped before it, and counts toward no
    sibling's sum. Post-processing of the noisy counts only. Returns the number
    dropped per length from 2 on.
    """
    dropped = []
    for at in range(1, len(levels)):
        prev, level = levels[at - 1], levels[at]
        k, rows, values = level.k, level.rows, level.table.values
        subs = [prev.table.find(prev.table.space.item_keys(items, np.delete(rows, j, axis=1)))
                for j in range(k)]
        present = np.all(np.stack(subs) >= 0, axis=0)
        counted = np.where(present, values, 0)
        covered = np.zeros(len(rows), dtype=bool)
        for j, sub in enumerate(subs):
            column = items.column[rows[:, j]]
            order = np.lexsort((-values, column, sub))
            group, ranked = (sub[order], column[order]), values[order]
            group_start = np.ones(len(order), dtype=bool)
            group_start[1:] = (group[0][1:] != group[0][:-1]) | (group[1][1:] != group[1][:-1])
            tie_start = group_start.copy()
            tie_start[1:] |= ranked[1:] != ranked[:-1]
            total = np.cumsum(counted[order])
            offset = np.append(0, total)[np.flatnonzero(group_start)][np.cumsum(group_start) - 1]
            before = total - counted[order] - offset  # same group, ranked before
            above = before[np.flatnonzero(tie_start)][np.cumsum(tie_start) - 1]
            parent = np.append(prev.table.values, 0)[sub[order]]
            covered[order] |= above < parent
        keep = covered & present
        dropped.append(int((~keep).sum()))
        if not keep.all():
            table = level.table
            levels[at] = Level(k, rows[keep], TupleTable(table.space, table.keys[keep],
                                                         values[keep]))
    return dropped
