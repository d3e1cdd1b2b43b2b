"""Post-processing: noisy measures -> the answer table (free: it only reads noisy values).

Counts stay integers (unbiased, so they may be negative, unless
``dpsql.nonnegative_counts`` is on); SUM is the noisy total in the column's
units; AVG is ``midpoint + noisy centred sum / noisy count``, clamped into the
bounds, and NULL when the noisy count is below one; the spread family is in
:func:`_spread`; a quantile is the value of its chosen grid point, with NULL
interval bounds (its accuracy is a rank, :meth:`QuantileNoise.rank_error`, not an
interval of values, which would need the private distribution). Each aggregate
of each cell is flagged when it is mostly noise (:func:`dominated`). Then the
validated SELECT expressions, HAVING, ORDER BY and LIMIT run over the noisy
table in Arrow, never in the database. With ``dpsql.ci`` set each bare
aggregate column gets ``<name>_ci_low`` / ``<name>_ci_high``: an interval that
holds the true (bounded, clamped) value with the stated confidence under the
noise alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeAlias, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from dpsql.errors import QueryRejected
from dpsql.mechanisms.additive import Noise
from dpsql.policy import Column
from dpsql.query.aggregates import bounds_of
from dpsql.query.evaluate import Value, as_type, evaluate
from dpsql.query.literals import sql_type
from dpsql.query.model import COUNTS, QUANTILES, SPREAD, Aggregate, QueryPlan
from dpsql.query.quantile import MeasureNoise, QuantileNoise
from dpsql.query.render import key_arrays, midpoint


def _sum_values(units: np.ndarray, noise_: Noise) -> np.ndarray:
    """Grid units in the answer's units: exact integers on a unit grid, else DOUBLE.

    A coarser grid (a sum of squares of a wide column: 2**23 per unit) in DOUBLE
    too, where int64 would overflow silently.
    """
    if noise_.exponent == 0:
        return units
    return np.ldexp(units.astype(np.float64), noise_.exponent)


Width: TypeAlias = Callable[[Noise, float], float]  # the half-width of a noise at a level


def exact_width(noise_: Noise, level: float) -> float:
    """The exact half-width (what the intervals show)."""
    return noise_.halfwidth(level)


def cheap_width(noise_: Noise, level: float) -> float:
    """An upper bound on the half-width that costs nothing (:meth:`Noise.halfwidth_bound`)."""
    return noise_.halfwidth_bound(level)


def aggregate_columns(plan: QueryPlan, noisy: list[np.ndarray], noises: tuple[MeasureNoise, ...],
                      confidence: float | None, nonnegative: bool = False
                      ) -> dict[str, pa.Array]:
    """``_a{j}`` (and ``_a{j}_lo``/``_hi`` with a confidence) for every aggregate.

    ``nonnegative``: counts (and their bounds) below zero are reported as 0. A
    distinct count (and its bounds) above the size of its column's declared domain is
    reported as that size (:func:`distinct_ceiling`). Both are post-processing with
    public facts.
    """
    out: dict[str, pa.Array] = {}
    for j, agg in enumerate(plan.aggregates):
        value, low, high = estimate(plan, agg, noisy, noises, confidence, exact_width)
        if nonnegative and agg.func in COUNTS:
            value = np.maximum(value, 0)
            low = None if low is None else np.maximum(low, 0)
            high = None if high is None else np.maximum(high, 0)
        column = plan.dataset.columns.get(agg.column or "")
        ceiling = distinct_ceiling(column) if agg.func == "count_distinct" and column else None
        if ceiling is not None:
            value = np.minimum(value, ceiling)
            low = None if low is None else np.minimum(low, ceiling)
            high = None if high is None else np.minimum(high, ceiling)
        out[f"_a{j}"] = _nan_to_null(value) if value.dtype.kind == "f" else pa.array(value)
        if confidence is not None:
            assert low is not None  # estimate() bounds every value when given a level
            assert high is not None
            out[f"_a{j}_lo"] = _nan_to_null(low) if low.dtype.kind == "f" else pa.array(low)
            out[f"_a{j}_hi"] = _nan_to_null(high) if high.dtype.kind == "f" else pa.array(high)
    return out


def distinct_ceiling(column: Column) -> int | None:
    """How many distinct non-NULL values ``column``'s declared domain holds (None: no limit).

    A categorical column's listed values; an integer column's integers between its
    bounds. Values kept outside the domain (``--outside keep``) count no further.
    """
    if column.type == "categorical" and column.values is not None:
        return len({v for v in column.values if v is not None})
    if column.type == "integer" and column.bounds is not None:
        lo, hi = column.bounds
        return max(0, math.floor(hi) - math.ceil(lo) + 1)
    return None


def noise_flags(plan: QueryPlan, noisy: list[np.ndarray], noises: tuple[MeasureNoise, ...],
                level: float) -> dict[str, pa.Array]:
    """``_a{j}_noise``: True in each cell whose value is mostly noise (see :func:`dominated`).

    Free: it reads only noisy values and public scales. The cheap upper bounds on
    the half-widths decide first; only an aggregate flagged by them is checked
    again with the exact half-widths (a wider interval flags at least as much).
    Exact aggregates, and quantiles, are never flagged: a quantile has no interval
    to test, and its accuracy (a rank error in rows, the same for every cell) is
    in EXPLAIN PRIVACY and the answer's column info.
    """
    out: dict[str, pa.Array] = {}
    for j, agg in enumerate(plan.aggregates):
        if agg.func in QUANTILES or not any(noises[m].noisy for m in agg.measures):
            out[f"_a{j}_noise"] = pa.array(np.zeros(plan.cells, dtype=bool))
            continue
        flags = dominated(plan, agg, *estimate(plan, agg, noisy, noises, level, cheap_width))
        if flags.any():
            flags = dominated(plan, agg, *estimate(plan, agg, noisy, noises, level, exact_width))
        out[f"_a{j}_noise"] = pa.array(flags)
    return out


def dominated(plan: QueryPlan, agg: Aggregate, value: np.ndarray, low: np.ndarray | None,
              high: np.ndarray | None) -> np.ndarray:
    """Cells where the noise dominates the value.

    A negative count; an undefined value (NULL); for COUNT and SUM an interval
    wider than the value (|value| < half-width); for AVG, VAR and STDDEV an
    interval covering at least half of what the aggregate can be (the bounds;
    [0, h^2]; [0, h], with h half the bounds' range).
    """
    assert low is not None
    assert high is not None
    value, low, high = (np.asarray(a, dtype=np.float64) for a in (value, low, high))
    undefined = np.isnan(value) | np.isnan(low) | np.isnan(high)
    half = (high - low) / 2
    if agg.func in (*COUNTS, "sum"):
        flags = np.abs(value) < half
        return flags | (value < 0) if agg.func in COUNTS else flags
    lo, hi = bounds_of(plan.dataset.column(agg.column or ""))  # type: ignore[misc]
    span = {"avg": hi - lo, "stddev_pop": (hi - lo) / 2, "stddev_samp": (hi - lo) / 2}.get(
        agg.func, ((hi - lo) / 2) ** 2)
    half = np.where(undefined, 0.0, half)
    return undefined | ((half >= span / 4) & (half > 0))


def estimate(plan: QueryPlan, agg: Aggregate, noisy: list[np.ndarray],
             noises: tuple[MeasureNoise, ...], level: float | None, width: Width
             ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """One aggregate's value in every cell, and its interval at ``level`` (None: none).

    A quantile's interval bounds are NaN (NULL in the answer): see the module docstring.
    """
    if agg.func in QUANTILES:
        noise_ = noises[agg.measures[0]]
        assert isinstance(noise_, QuantileNoise)
        value = noise_.grid.values(noisy[agg.measures[0]])
        unknown = None if level is None else np.full(value.size, np.nan)
        return value, unknown, unknown
    additive = cast(tuple[Noise, ...], noises)  # every measure but a quantile's
    if agg.func == "avg":
        return _average(plan, agg, noisy, additive, level, width)
    if agg.func in SPREAD:
        return _spread(plan, agg, noisy, additive, level, width)
    m = agg.measures[0]
    value = _sum_values(noisy[m], additive[m]) if agg.func == "sum" else noisy[m]
    if level is None:
        return value, None, None
    half = width(additive[m], level)
    if value.dtype.kind == "i" and half == int(half):
        return value, value - int(half), value + int(half)
    return value, value - half, value + half


def _average(plan: QueryPlan, agg: Aggregate, noisy: list[np.ndarray],
             noises: tuple[Noise, ...], confidence: float | None, width: Width
             ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    sum_m, count_m = agg.measures
    col = plan.dataset.column(agg.column or "")
    lo, hi = bounds_of(col)  # type: ignore[misc]
    mid = float(midpoint(col))
    total = _sum_values(noisy[sum_m], noises[sum_m]).astype(np.float64)
    count = noisy[count_m].astype(np.float64)
    defined = count >= 1
    safe = np.where(defined, count, 1.0)
    value = np.where(defined, np.clip(mid + total / safe, lo, hi), np.nan)
    if confidence is None:
        return value, None, None
    # Each part at 1 - (1 - c)/2, so both hold together with probability >= c (union bound).
    part = 1 - (1 - confidence) / 2
    hs, hc = width(noises[sum_m], part), width(noises[count_m], part)
    corners = [mid + (total + s) / np.maximum(count + c, 1) for s in (-hs, hs) for c in (-hc, hc)]
    positive = count - hc >= 1
    low = np.where(positive, np.clip(np.minimum.reduce(corners), lo, hi), lo)
    high = np.where(positive, np.clip(np.maximum.reduce(corners), lo, hi), hi)
    low = np.where(defined, low, np.nan)
    high = np.where(defined, high, np.nan)
    return value, low, high


def _spread(plan: QueryPlan, agg: Aggregate, noisy: list[np.ndarray],
            noises: tuple[Noise, ...], confidence: float | None, width: Width
            ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """VAR_POP, VAR_SAMP, STDDEV_POP, STDDEV_SAMP from centred squares S2, centred sum S1, count n.

    var_pop = S2/n - (S1/n)^2 (the mean clipped to [-h, h], the variance to
    [0, h^2], h half the bounds' range); var_samp = var_pop * n / (n - 1), NULL
    below two rows (var_pop below one). The interval is exact over the box of
    the three parts' intervals, each at 1 - (1 - c)/3 (union bound): no
    approximation, so it holds with probability >= c under the noise alone.
    """
    sq_m, sum_m, count_m = agg.measures
    lo, hi = bounds_of(plan.dataset.column(agg.column or ""))  # type: ignore[misc]
    h2 = ((hi - lo) / 2) ** 2
    squares = _sum_values(noisy[sq_m], noises[sq_m]).astype(np.float64)
    total = _sum_values(noisy[sum_m], noises[sum_m]).astype(np.float64)
    count = noisy[count_m].astype(np.float64)
    sample = agg.func.endswith("_samp")
    least = 2.0 if sample else 1.0
    defined = count >= least
    n = np.where(defined, count, least)
    mean = np.clip(total / n, -math.sqrt(h2), math.sqrt(h2))
    value = np.clip(squares / n - mean * mean, 0.0, h2)
    if sample:
        value = value * n / (n - 1)
    value = np.where(defined, value, np.nan)
    low = high = None
    if confidence is not None:
        part = 1 - (1 - confidence) / 3
        w2, w1, wc = (width(noises[m], part) for m in agg.measures)
        low, high = _spread_box(squares, total, count, (w2, w1, wc), h2, least)
        if sample:
            n_lo, n_hi = np.maximum(count - wc, least), np.maximum(count + wc, least)
            known = count - wc >= least
            low = np.where(known, low * n_hi / (n_hi - 1), 0.0)
            high = np.where(known, high * n_lo / (n_lo - 1), 2 * h2)
        low, high = np.where(defined, low, np.nan), np.where(defined, high, np.nan)
    if agg.func.startswith("stddev"):
        return tuple(None if a is None else np.sqrt(a)  # type: ignore[return-value]
                     for a in (value, low, high))
    return value, low, high


def _spread_box(squares: np.ndarray, total: np.ndarray, count: np.ndarray,
                widths: tuple[float, float, float], h2: float, least: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """The least and greatest S2 t - S1^2 t^2 (t = 1/n) over the box of the parts' intervals.

    The function is concave in t, increasing in S2 and decreasing in S1^2: the
    greatest is at S2's top, S1^2's least and the clipped vertex in t; the least
    at S2's bottom, S1^2's greatest and an end of t. Clipped to [0, h^2];
    [0, h^2] when the count's interval reaches below ``least``.
    """
    w2, w1, wc = widths
    known = count - wc >= least
    t_lo = 1 / np.maximum(count + wc, least)
    t_hi = 1 / np.maximum(count - wc, least)
    s1_lo, s1_hi = total - w1, total + w1
    a_min = np.where((s1_lo <= 0) & (s1_hi >= 0), 0.0, np.minimum(s1_lo**2, s1_hi**2))
    a_max = np.maximum(s1_lo**2, s1_hi**2)
    top = squares + w2
    vertex = np.where(a_min > 0, top / (2 * np.where(a_min > 0, a_min, 1.0)), t_hi)
    t = np.clip(vertex, t_lo, t_hi)
    high = top * t - a_min * t * t
    bottom = squares - w2
    low = np.minimum(bottom * t_lo - a_max * t_lo**2, bottom * t_hi - a_max * t_hi**2)
    low = np.where(known, np.clip(low, 0.0, h2), 0.0)
    high = np.where(known, np.clip(high, 0.0, h2), h2)
    return low, high


def _nan_to_null(values: np.ndarray) -> Any:
    return pa.array(values, mask=np.isnan(values))


def base_table(plan: QueryPlan, noisy: list[np.ndarray], noises: tuple[MeasureNoise, ...],
               confidence: float | None, level: float, nonnegative: bool = False) -> pa.Table:
    """One row per public cell: keys ``_k{i}``, noisy aggregates ``_a{j}`` and their flags.

    ``level``: the confidence at which the noise flags ``_a{j}_noise`` are judged.
    """
    columns: dict[str, Any] = {f"_k{i}": a for i, a in enumerate(key_arrays(plan))}
    columns.update(aggregate_columns(plan, noisy, noises, confidence, nonnegative))
    columns.update(noise_flags(plan, noisy, noises, level))
    if not columns:
        return pa.table({"_empty": pa.array([0])})
    return pa.table(columns)


def answer_table(plan: QueryPlan, base: pa.Table, confidence: float | None
                 ) -> tuple[pa.Table, dict[str, list[bool]]]:
    """Apply HAVING, the SELECT expressions, ORDER BY and LIMIT/OFFSET to the noisy cells.

    Also returns, per bare aggregate column, which of the answer's rows are
    mostly noise (:func:`dominated`).
    """
    if plan.having is not None:
        keep = as_type(_as_array(evaluate(plan.having, base), base.num_rows), pa.bool_())
        base = base.filter(pc.fill_null(keep, False))
    if plan.order:
        base = base.take(pa.array(_order_indices(plan, base), type=pa.int64()))
    start = plan.offset or 0
    stop = None if plan.limit is None else start + plan.limit
    base = base.slice(start, None if stop is None else max(0, stop - start))
    columns: dict[str, Any] = {}
    flags: dict[str, list[bool]] = {}
    for output in plan.outputs:
        columns[output.name] = _as_array(evaluate(output.expr, base), base.num_rows)
        if output.aggregate is not None:
            flags[output.name] = base.column(f"_a{output.aggregate}_noise").to_pylist()
        if confidence is not None and output.aggregate is not None:
            columns[f"{output.name}_ci_low"] = base.column(f"_a{output.aggregate}_lo")
            columns[f"{output.name}_ci_high"] = base.column(f"_a{output.aggregate}_hi")
    return pa.table(columns), flags


def check_post(plan: QueryPlan, noises: tuple[MeasureNoise, ...], confidence: float | None,
               level: float, nonnegative: bool, column_types: Mapping[str, str]) -> None:
    """Run the post-processing over stand-in cells of the answer's exact types: before a charge.

    What SELECT, HAVING and ORDER BY compute over the noisy cells can fail only
    on a type it cannot handle (a literal Arrow cannot cast, an operation that a
    column type lacks); the types are public and fixed before the charge (the
    keys', the calibrated measures', the literals'), and :func:`evaluate` makes
    every operation total over values. So evaluating it once over cells of those
    types (zero measures: a valid value of every measure) finds any failure
    before anything is spent. A selected key's type is its column's (keys
    released) or Arrow's null type (no key released, or only NULL): both are
    tried. Raises QueryRejected naming the clause; reads no data. A plan that
    only selects and orders by bare columns computes nothing and is not run.
    """
    if plan.having is None and all(isinstance(e, exp.Column) for e in (
            *(o.expr for o in plan.outputs), *(o.expr for o in plan.order))):
        return
    for keys in _stand_in_keys(plan, column_types):
        # The first key's two values make the two cells; the other keys keep one each.
        stand_in = replace(plan, keys=tuple(
            replace(k, values=tuple(a.to_pylist()[:2 if i == 0 else 1]))
            for i, (k, a) in enumerate(zip(plan.keys, keys, strict=True))))
        columns = [a if i == 0 else a.take([0, 0]) for i, a in enumerate(keys)]
        zeros = [np.zeros(stand_in.cells, dtype=np.int64) for _ in plan.measures]
        base = base_table(stand_in, zeros, noises, confidence, level, nonnegative)
        for i, typed in enumerate(columns):
            base = base.set_column(i, f"_k{i}", typed)
        try:
            answer_table(stand_in, base, confidence)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise QueryRejected(
                f"the SELECT, HAVING and ORDER BY expressions cannot be computed over the "
                f"noisy answer ({reason}); nothing was charged",
                construct="post-processing", advice="write numbers that a DOUBLE holds, and "
                "compare values of one type") from err


def answer_types(noises: tuple[MeasureNoise, ...], confidence: float | None,
                 nonnegative: bool) -> tuple[Any, ...]:
    """What decides the types of a plan's answer columns besides the plan itself.

    What :func:`check_post` checked once holds for every answer with the same.
    """
    return (confidence is not None, nonnegative,
            tuple((type(n).__name__, getattr(n, "exponent", None)) for n in noises))


def _stand_in_keys(plan: QueryPlan, column_types: Mapping[str, str]) -> list[list[pa.Array]]:
    """Key columns of every type the answer's keys may have, two cells each."""
    typed, nulls = [], []
    for key, array in zip(plan.keys, plan.key_arrays, strict=True):
        if key.mode == "selected":
            sample = _SAMPLES.get(sql_type(column_types.get(key.column, "")))
            array = pa.array([sample, None])
        typed.append(array.slice(0, 2) if len(array) >= 2 else pa.array(
            [*array.to_pylist(), None][:2], array.type))
        nulls.append(pa.nulls(2) if key.mode == "selected" else typed[-1])
    variants = [typed]
    if any(k.mode == "selected" for k in plan.keys):
        variants.append(nulls)
    return variants


#: A released key's value of each predicate type (what ``to_pylist`` gives for the column).
_SAMPLES: dict[str, Any] = {"num": 0, "str": "", "bool": False}


def _order_indices(plan: QueryPlan, table: pa.Table) -> np.ndarray:
    keys = []
    for item in plan.order:
        values = _as_array(evaluate(item.expr, table), table.num_rows)
        if pa.types.is_null(values.type):
            continue  # ORDER BY NULL: a constant, no effect on the order
        nulls_last = not item.nulls_first
        # Nulls sort after every value when (ascending and nulls last) or (descending and
        # nulls first); ranking them at the other end and negating flips them as needed.
        placement = "at_end" if nulls_last != item.desc else "at_start"
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        ranks = pc.rank(values, sort_keys=[("", "ascending", placement)],
                        tiebreaker="dense").to_numpy().astype(np.int64)
        keys.append(-ranks if item.desc else ranks)
    return np.lexsort(keys[::-1]) if keys else np.arange(table.num_rows)


def _as_array(value: Value, length: int) -> pa.Array | pa.ChunkedArray:
    if isinstance(value, pa.Scalar):
        return pa.array([value.as_py()] * length, type=value.type)
    return value
