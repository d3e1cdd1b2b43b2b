"""QueryPlan -> bounded aggregation SQL (a sqlglot AST) and the noise of each measure.

The SQL is built by small pure passes, applied in order (``PASSES``):

1. ``bound_contributions``: read the bounded source (at most ``max_rows`` rows
   per privacy unit, chosen by a hash seeded with the store secret);
2. ``filter_rows``: the validated WHERE predicate;
3. ``encode_keys``: one column per GROUP BY key, integer codes for binned
   numeric keys (values clamped into bounds first, NaN and infinities
   included), the raw value for categorical keys (mapped to codes afterwards);
4. ``clamp_and_sum``: COUNT, COUNT(DISTINCT), or SUM of clamped values on a
   fixed-point grid, with FILTER predicates; totals are capped so no cast can fail.

After the engine runs it, ``expand_public_keys`` turns the sparse result into
dense vectors over the full public key set (empty groups are zeros, values
outside the public domain fall in no cell). Nothing in the generated SQL can
raise on particular data: casts are of clamped values, arithmetic is in DOUBLE.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from dpsql.domain import Attribute, clamp_sql, quote, sql_literal
from dpsql.engines.source import bounded_sql
from dpsql.errors import ConfigurationError, QueryRejected
from dpsql.imports import BOUNDABLE_TYPES
from dpsql.mechanisms.additive import Noise
from dpsql.noise import FixedPoint
from dpsql.policy import Column
from dpsql.privacy import Kind, PrivacyCost
from dpsql.public import SCHEMA as PUBLIC_SCHEMA
from dpsql.query.aggregates import bounds_of
from dpsql.query.literals import total_numeric
from dpsql.query.model import GroupKey, Join, Measure, QueryPlan
from dpsql.query.quantile import Grid, MeasureNoise, histograms, quantile_noise

_INTEGER_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT",
                  "UINTEGER", "INT", "INT1", "INT2", "INT4", "INT8")
_FLOAT_TYPES = ("DOUBLE", "FLOAT", "REAL", "FLOAT4", "FLOAT8")
_FAST_LIMIT = 2**52  # integer clamping stays in integers below this magnitude
_SUM_CAP = 2**62  # totals are capped here before the cast to BIGINT
COUNTED = ("count", "distinct")  # measures that count rows or values: one per row at most


#: Grid steps per bound for real-valued sums: fine enough that rounding (at most half a
#: step per row) is far below the noise, coarse enough for the samplers' parameter range.
NOISY_UNITS = 2**16
#: Without noise (an unbounded budget) the grid only has to keep totals inside int64.
EXACT_UNITS = 2**30


@dataclass(frozen=True)
class Context:
    """What the passes need besides the plan.

    The store secret, the column types, whether the answer is exact (an
    unbounded budget: no noise, so a finer grid), and the bounds the database
    itself enforces (:meth:`dpsql.engines.base.Engine.enforced_bounds`).
    """

    secret: str
    types: Mapping[str, str]
    exact: bool = False
    enforced: Mapping[str, tuple[Fraction, Fraction]] = field(default_factory=dict)

    @property
    def units(self) -> int:
        """Grid steps per bound for real-valued sums."""
        return EXACT_UNITS if self.exact else NOISY_UNITS


@lru_cache(maxsize=512)
def _parsed(text: str) -> exp.Expr:
    return sqlglot.parse_one(text, read="duckdb")


def _sql(text: str) -> exp.Expr:
    """Parse dpsql-generated SQL text (public literals and quoted names only); a fresh copy."""
    return _parsed(text).copy()


def _integer_column(col: Column, ctx: Context) -> bool:
    """Integer-typed in the table with bounds small enough for exact integer arithmetic."""
    bounds = bounds_of(col)
    return (ctx.types[col.name].upper() in _INTEGER_TYPES and bounds is not None
            and all(b == int(b) and abs(b) < _FAST_LIMIT for b in bounds))


def _clamped(col: Column, ctx: Context) -> str:
    """SQL for ``col`` clamped into its bounds.

    NULL stays NULL, NaN goes to the lower bound, infinities to the bound on
    their side, as :func:`dpsql.domain.clamp_sql`, but typed: comparisons in the
    column's own type instead of a TRY_CAST to DOUBLE (about 30% faster).
    """
    bounds = bounds_of(col)
    assert bounds is not None
    name = quote(col.name)
    kind = ctx.types[col.name].upper()
    if _held(col, bounds, kind, ctx):
        return name
    if not total_numeric(kind):
        # Wide decimals, HUGEINT, UBIGINT: compared with a bound they are cast in ways
        # that raise on large values; read them as DOUBLE (TRY_CAST: never raises).
        return clamp_sql(name, bounds)
    if kind in _INTEGER_TYPES and all(b == int(b) for b in bounds):
        lo, hi = (str(int(b)) for b in bounds)
        nan = ""
    else:
        lo, hi = (sql_literal(float(b)) for b in bounds)
        nan = f"WHEN isnan({name}) THEN {lo} " if kind in _FLOAT_TYPES else ""
    return (f"(CASE {nan}WHEN {name} < {lo} THEN {lo} WHEN {name} > {hi} THEN {hi} "
            f"ELSE {name} END)")


def _held(col: Column, bounds: tuple[float, float], kind: str, ctx: Context) -> bool:
    """The database keeps every value of ``col`` inside its declared bounds already.

    Then clamping is the identity and is left out (a CASE per row costs about a
    quarter of a plain SUM). NULL stays NULL either way.
    """
    held = ctx.enforced.get(col.name)
    return (held is not None and kind in BOUNDABLE_TYPES
            and Fraction(bounds[0]) <= held[0] and held[1] <= Fraction(bounds[1]))


def clamped_columns(plan: QueryPlan) -> set[str]:
    """The columns whose values the generated SQL clamps (sums and numeric keys)."""
    columns = {m.column for m in plan.measures if m.kind not in COUNTED and m.column}
    columns |= {k.column for k in plan.keys if k.mode in ("value", "width")
                and plan.column(k.column).type != "categorical"}
    return columns


# -- fixed point ----------------------------------------------------------------------


def fixed_point(measure: Measure, col: Column | None, ctx: Context) -> tuple[int, int]:
    """(grid exponent, largest |grid units| one row adds) for a measure.

    A row adds one to a count, and at most one distinct value to its cell's distinct count.
    """
    if measure.kind in COUNTED:
        return 0, 1
    assert col is not None
    lo, hi = bounds_of(col)  # type: ignore[misc]
    if measure.kind == "sum":
        bound = max(abs(lo), abs(hi))
        if _integer_column(col, ctx):
            return 0, int(bound)
        fp = FixedPoint.for_bound(bound, ctx.units)
        return fp.exponent, fp.sensitivity_units(bound)
    half = Fraction(hi - lo) / 2
    if measure.kind == "centered_squares":
        return _squares_point(col, half, ctx)
    if _integer_column(col, ctx):
        exponent = 0 if (int(lo) + int(hi)) % 2 == 0 else -1
        return exponent, math.ceil(half / Fraction(2) ** exponent)
    fp = FixedPoint.for_bound(float(half), ctx.units)
    return fp.exponent, fp.sensitivity_units(float(half))


def _squares_point(col: Column, half: Fraction, ctx: Context) -> tuple[int, int]:
    """(grid exponent, largest grid units one row adds) for ``(value - midpoint)**2``.

    Integer columns whose range squared fits BIGINT square exactly: ``(x - mid)**2``
    when the midpoint is an integer, else ``(2x - lo - hi)**2`` in quarter units.
    """
    if _exact_squares(col, ctx):
        exponent = 0 if half == int(half) else -2
        return exponent, int(half * half / Fraction(2) ** exponent)
    fp = FixedPoint.for_bound(float(half * half), ctx.units)
    return fp.exponent, fp.sensitivity_units(float(half * half))


def _exact_squares(col: Column, ctx: Context) -> bool:
    """An integer column whose squared range stays below 2**60 (no BIGINT overflow per row)."""
    lo, hi = bounds_of(col)  # type: ignore[misc]
    return _integer_column(col, ctx) and hi - lo <= 2**30


def midpoint(col: Column) -> Fraction:
    lo, hi = bounds_of(col)  # type: ignore[misc]
    return (Fraction(lo) + Fraction(hi)) / 2


def _units(measure: Measure, col: Column, ctx: Context) -> str:
    """SQL for one row's value in grid units (BIGINT, NULL for NULL)."""
    exponent, _ = fixed_point(measure, col, ctx)
    value = _clamped(col, ctx)
    if measure.kind == "centered_squares":
        return _squares_units(col, exponent, value, ctx)
    if measure.kind == "centered_sum":
        twice_mid = int(midpoint(col) * 2) if _integer_column(col, ctx) else None
        wide = f"CAST({value} AS BIGINT)"  # no INT32 overflow, whatever the row holds
        if twice_mid is not None and exponent == -1:
            return f"(2 * {wide} - {twice_mid})"
        if twice_mid is not None:
            return f"({wide} - {twice_mid // 2})"
        value = f"({value} - {sql_literal(float(midpoint(col)))})"
    elif _integer_column(col, ctx):
        return value
    scale = sql_literal(float(Fraction(2) ** -exponent))
    return f"CAST(round({value} * {scale}) AS BIGINT)"


def _squares_units(col: Column, exponent: int, value: str, ctx: Context) -> str:
    """SQL for one row's ``(value - midpoint)**2`` in grid units (BIGINT, never raising).

    Exact in BIGINT for small integer ranges; otherwise squared in DOUBLE (the
    clamped value's distance to the midpoint is at most half the range, so the
    rounded grid units fit BIGINT).
    """
    if _exact_squares(col, ctx):
        twice_mid = int(midpoint(col) * 2)
        wide = f"CAST({value} AS BIGINT)"
        diff = f"(2 * {wide} - {twice_mid})" if exponent == -2 else \
            f"({wide} - {twice_mid // 2})"
        return f"({diff} * {diff})"
    diff = f"(CAST({value} AS DOUBLE) - {sql_literal(float(midpoint(col)))})"
    scale = sql_literal(float(Fraction(2) ** -exponent))
    return f"CAST(round({diff} * {diff} * {scale}) AS BIGINT)"


# -- passes ---------------------------------------------------------------------------


def bound_contributions(select: exp.Select, plan: QueryPlan, ctx: Context) -> exp.Select:
    """Read from the bounded source: at most ``max_rows`` rows per privacy unit.

    A join to a public table comes after the bounding, so it bounds private rows,
    and each bounded row meets at most one public row (:func:`join_sql`).
    """
    source = _sql(f"SELECT * FROM {bounded_sql(plan.dataset, ctx.secret, ctx.types)}"
                  + (join_sql(plan.join) if plan.join is not None else ""))
    assert isinstance(source, exp.Select)
    out = select.copy().from_(source.args["from_"].this, copy=False)
    if source.args.get("joins"):
        out.set("joins", source.args["joins"])
    return out


def join_sql(join: Join) -> str:
    """`` [LEFT] JOIN`` the public table, its columns renamed ``<table>.<column>``.

    Rows whose key occurs more than once are left out, so a row matches at most
    one public row by construction, whatever the table holds now (applying the
    policy refuses such a table; this is the second layer).
    """
    renamed = ", ".join(f"{quote(c)} AS {quote(f'{join.table}.{c}')}" for c in join.columns)
    key = quote(join.key)
    public = (f"(SELECT {renamed} FROM {PUBLIC_SCHEMA}.{quote(join.table)} "
              f"QUALIFY count(*) OVER (PARTITION BY {key}) = 1) AS _pub")
    return (f" {'' if join.inner else 'LEFT '}JOIN {public} ON _src.{quote(join.on)} = "
            f"_pub.{quote(f'{join.table}.{join.key}')}")


def filter_rows(select: exp.Select, plan: QueryPlan, ctx: Context) -> exp.Select:
    """Keep the rows the WHERE predicate accepts (a row-level function: no sensitivity change)."""
    if plan.where is None:
        return select
    return select.copy().where(plan.where.copy(), copy=False)


def key_sql(key: GroupKey, col: Column, ctx: Context) -> str:
    """SQL for one key: the raw value (categorical) or an integer code (numeric)."""
    name = quote(col.name)
    if col.type == "categorical":
        return name
    null_code = str(len(key.values) - 1) if col.nullable else "NULL"
    if key.mode == "policy_bins":
        return Attribute(col).encode_sql(name)
    # A code is the clamped value's offset from the first key, at most the key set's size:
    # subtracting in BIGINT or DOUBLE first keeps a narrow column's type (TINYINT - -100
    # overflows) and a value far from zero (CAST(1e20 AS BIGINT)) out of the arithmetic.
    if key.mode == "value":
        assert col.bounds is not None
        value, low = _clamped(col, ctx), int(col.bounds[0])
        if _integer_column(col, ctx):
            code = f"CAST({value} AS BIGINT) - {low}"
        else:
            code = f"CAST(floor({value}) - {sql_literal(float(low))} AS BIGINT)"
    else:
        assert col.bounds is not None
        assert key.width is not None
        first = float(math.floor(col.bounds[0] / key.width))
        code = (f"CAST(floor(CAST({_clamped(col, ctx)} AS DOUBLE) / {sql_literal(key.width)}) "
                f"- {sql_literal(first)} AS BIGINT)")
    # The code is NULL exactly when the value is (clamping keeps every other value, NaN
    # included, a number): a NULL gets the null key's code, or stays NULL (no key) when
    # the column cannot hold one. coalesce runs faster than a CASE per row.
    return f"coalesce({code}, {null_code})" if col.nullable else code


def encode_keys(select: exp.Select, plan: QueryPlan, ctx: Context) -> exp.Select:
    """One column per key (``_k{i}``) and GROUP BY them."""
    out = select.copy()
    for i, key in enumerate(plan.keys):
        col = plan.column(key.column)
        out = out.select(exp.alias_(_sql(key_sql(key, col, ctx)), f"_k{i}"), copy=False)
    if plan.keys:
        out = out.group_by(*[exp.column(f"_k{i}") for i in range(len(plan.keys))], copy=False)
    return out


def grid(col: Column, ctx: Context) -> Grid:
    """The public candidates of a quantile of ``col`` (:mod:`dpsql.query.quantile`)."""
    bounds = bounds_of(col)
    assert bounds is not None
    return Grid.over(bounds, _integer_column(col, ctx))


def measure_sql(measure: Measure, plan: QueryPlan, ctx: Context) -> exp.Expr:
    """The aggregate of one measure, total on any data."""
    if measure.kind == "count":
        inner = f"COUNT({quote(measure.column) if measure.column else '*'})"
    elif measure.kind == "distinct":
        inner = f"COUNT(DISTINCT {quote(measure.column or '')})"
    elif measure.kind == "quantile":
        col = plan.dataset.column(measure.column or "")
        position = grid(col, ctx).position_sql(_clamped(col, ctx), _integer_column(col, ctx))
        inner = f"histogram({position})"
    else:
        col = plan.dataset.column(measure.column or "")
        inner = f"SUM({_units(measure, col, ctx)})"
    node = _sql(inner)
    if measure.filter is not None:
        node = exp.Filter(this=node, expression=exp.Where(this=measure.filter.copy()))
    if measure.kind in (*COUNTED, "quantile"):
        return node
    capped = f"least(greatest(coalesce(_x, 0), -{_SUM_CAP}), {_SUM_CAP})"
    wrapper = _sql(f"CAST({capped} AS BIGINT)")
    for column in wrapper.find_all(exp.Column):
        if column.name == "_x":
            column.replace(node)
            break
    return wrapper


def clamp_and_sum(select: exp.Select, plan: QueryPlan, ctx: Context) -> exp.Select:
    """One aggregate per measure (``_m{j}``): counts, or fixed-point sums of clamped values."""
    out = select.copy()
    for j, measure in enumerate(plan.measures):
        out = out.select(exp.alias_(measure_sql(measure, plan, ctx), f"_m{j}"), copy=False)
    return out


Pass = Callable[[exp.Select, QueryPlan, Context], exp.Select]
PASSES: tuple[Pass, ...] = (bound_contributions, filter_rows, encode_keys, clamp_and_sum)


def to_sql(plan: QueryPlan, ctx: Context) -> exp.Select:
    """The bounded aggregation query of ``plan`` as a sqlglot AST (DuckDB dialect)."""
    select = exp.Select()
    for step in PASSES:
        select = step(select, plan, ctx)
    return select


# -- noise ------------------------------------------------------------------------------


def calibrate(plan: QueryPlan, cost: PrivacyCost, accounting: Kind,
              ctx: Context) -> tuple[MeasureNoise, ...]:
    """The noise of each measure, with ``cost`` split equally among the measures."""
    shares = cost.split([1] * len(plan.measures))
    return tuple(calibrate_measure(plan, measure, share, accounting, ctx)
                 for measure, share in zip(plan.measures, shares, strict=True))


def calibrate_measure(plan: QueryPlan, measure: Measure, share: PrivacyCost, accounting: Kind,
                      ctx: Context) -> MeasureNoise:
    """The noise of one measure of ``plan`` given its ``share`` of the query's cost.

    Privacy: sensitivity ``max_rows`` times what one row adds (:func:`fixed_point`),
    the policy's additive noise (:mod:`dpsql.mechanisms.additive`); a quantile's
    exponential mechanism over its column's grid (:func:`dpsql.query.quantile.quantile_noise`).
    Noise too small for the sampler refuses the query, before any charge.
    """
    col = plan.dataset.column(measure.column) if measure.column else None
    if measure.kind == "quantile":
        assert col is not None
        assert measure.q is not None
        return quantile_noise(plan.cells, plan.dataset.max_rows, measure.q, grid(col, ctx),
                              accounting, share)
    exponent, per_row = fixed_point(measure, col, ctx)
    sensitivity = plan.dataset.max_rows * per_row
    try:
        return Noise.calibrate(accounting, sensitivity, exponent, share)
    except ConfigurationError as err:
        what = f"{measure.kind}({measure.column or '*'})"
        raise QueryRejected(f"the privacy cost is too small for {what}: {err}",
                            construct="privacy cost",
                            advice="raise epsilon, or aggregate fewer columns at once") from err


# -- expand_public_keys -----------------------------------------------------------------


def _codes(key: GroupKey, col: Column, column: pa.ChunkedArray) -> np.ndarray:
    """Codes 0..size-1 of a key column of the sparse result; -1 outside the public domain."""
    size = len(key.values)
    if col.type == "categorical":
        if pa.types.is_dictionary(column.type):  # an ENUM column arrives dictionary-encoded
            column = column.cast(column.type.value_type)
        values = [v for v in key.values if v is not None]
        value_set, positions = _value_set(values, column.type)
        found = pc.index_in(column, value_set=value_set)
        codes = found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        if positions is not None:
            codes = np.where(codes >= 0, positions[np.maximum(codes, 0)], -1)
        if col.nullable:
            codes[column.is_null().to_numpy(zero_copy_only=False)] = size - 1
        return codes
    codes = column.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    codes[(codes < 0) | (codes >= size)] = -1
    return codes


def _value_set(values: list[Any], kind: pa.DataType) -> tuple[pa.Array, np.ndarray | None]:
    """The declared values as the column's type, and their codes if some cannot be.

    A declared value the column type cannot hold (300 for a TINYINT) matches no row;
    it must not make the cast fail after the charge.
    """
    try:
        return pa.array(values, kind), None
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    kept = []
    for i, value in enumerate(values):
        with contextlib.suppress(pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pa.array([value], kind)
            kept.append(i)
    return pa.array([values[i] for i in kept], kind), np.array(kept, dtype=np.int64)


def expand_public_keys(plan: QueryPlan, sparse: pa.Table) -> list[Any]:
    """Per measure, its exact values over every public cell, in key-code order.

    Dense int64 vectors for counts and sums; for a quantile, each cell's histogram
    of grid positions (:func:`dpsql.query.quantile.histograms`).
    """
    quantiles = any(m.kind == "quantile" for m in plan.measures)
    if not plan.keys and sparse.num_rows == 1 and not quantiles:  # global: one row, one cell
        return [np.array([sparse.column(f"_m{j}")[0].as_py() or 0], dtype=np.int64)
                for j in range(len(plan.measures))]
    cells = plan.cells
    index = np.zeros(sparse.num_rows, dtype=np.int64)
    keep = np.ones(sparse.num_rows, dtype=bool)
    for i, key in enumerate(plan.keys):
        codes = _codes(key, plan.column(key.column), sparse.column(f"_k{i}"))
        keep &= codes >= 0
        index = index * key.size + np.where(codes >= 0, codes, 0)
    out: list[Any] = []
    for j, measure in enumerate(plan.measures):
        if measure.kind == "quantile":
            out.append(histograms(sparse.column(f"_m{j}"), index[keep], keep, cells))
            continue
        values = sparse.column(f"_m{j}").fill_null(0).to_numpy(zero_copy_only=False)
        dense = np.zeros(cells, dtype=np.int64)
        np.add.at(dense, index[keep], values.astype(np.int64)[keep])
        out.append(dense)
    return out


def key_arrays(plan: QueryPlan) -> list[pa.Array]:
    """The public key value of every cell, per key (cells in code order, first key slowest)."""
    return list(plan.key_arrays)


__all__ = ["PASSES", "Context", "calibrate", "expand_public_keys", "key_arrays", "to_sql"]

