"""DP within-bin shapes: how a numeric bin's values spread, for ``decode: shape`` columns.

A synthesizer models a numeric column by its bins; decoding a bin with a
uniform draw flattens every peak inside it (hours per week at 40, ages at round
numbers). For the columns the policy marks ``decode: shape``, a release that
samples rows spends :data:`SHARE` of its budget on one noisy histogram per
column over :data:`SUB_BINS` equal sub-bins of every bin (its provenance's
``spent`` counts them), and decoding draws a sub-bin from its bin's noisy
shape, then a value uniformly inside it. A release of a representation
(``range``) decodes nothing and measures no shape.

Privacy: each histogram is a marginal of the bounded source (every value
counted in exactly one cell, NULLs in none), so one privacy unit moves it by at
most ``max_rows`` in L1 and L2; :func:`dpsql.synth.measure.measure_counts` adds
the noise within each column's equal part of the shape budget. The shapes are
post-processed noisy counts, DP like the synthetic rows, and are kept in the
release's provenance so that later copies decode alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import duckdb
import numpy as np

from dpsql.domain import SUB_BINS, Attribute, Domain, integer_starts, quote, sql_literal
from dpsql.privacy import PrivacyCost
from dpsql.synth.measure import Measurement, measure_counts

SHARE = Fraction(1, 10)  # of a release's budget, when a column asks for a shape


def shaped(domain: Domain) -> list[str]:
    """The domain's numeric columns whose policy says ``decode: shape``."""
    return [a.name for a in domain.attributes
            if a.column.type != "categorical" and a.column.decode == "shape"]


def widths(attribute: Attribute) -> np.ndarray:
    """Per bin and sub-bin, whether the sub-bin holds any value (public: edges only).

    A float sub-bin always does; an integer bin narrower than :data:`SUB_BINS`
    leaves some sub-bins without an integer.
    """
    edges = np.asarray(attribute.column.edges, dtype=np.float64)
    starts = integer_starts(edges) if attribute.column.type == "integer" else None
    if starts is None:
        return np.ones((len(edges) - 1, SUB_BINS), dtype=bool)
    return starts[:, 1:] > starts[:, :-1]


def _sub_bin_sql(attribute: Attribute) -> str:
    """SQL of the cell (bin * SUB_BINS + sub-bin) of the column's clamped value, NULL for NULL."""
    col = attribute.column
    assert col.edges is not None
    assert col.bounds is not None
    name = quote(col.name)
    code = attribute.encode_sql(name)
    edges = "[" + ", ".join(sql_literal(float(e)) for e in col.edges) + "]"
    lo, hi = (sql_literal(float(b)) for b in col.bounds)
    value = f"least(greatest(CAST({name} AS DOUBLE), {lo}), {hi})"
    start, end = f"{edges}[{code} + 1]", f"{edges}[{code} + 2]"
    fraction = f"({value} - {start}) / ({end} - {start})"
    sub = f"least({SUB_BINS - 1}, CAST(floor({fraction} * {SUB_BINS}) AS BIGINT))"
    return f"CASE WHEN {code} IS NULL OR isnan(CAST({name} AS DOUBLE)) THEN NULL " \
           f"ELSE {code} * {SUB_BINS} + {sub} END"


@dataclass(frozen=True)
class Shapes:
    """The measured shapes: per column, per bin, the probability of each sub-bin."""

    probabilities: dict[str, list[list[float]]]
    measurements: list[Measurement]

    @property
    def cost(self) -> PrivacyCost:
        """What the measurements spent together."""
        total = self.measurements[0].cost
        for m in self.measurements[1:]:
            total = total + m.cost
        return total

    def describe(self) -> dict[str, Any]:
        """JSON-able: the DP shapes themselves and how they were measured."""
        return {"sub_bins": SUB_BINS, "share": str(SHARE), "probabilities": self.probabilities,
                "measurements": [m.describe() for m in self.measurements]}


def measure(source: duckdb.DuckDBPyRelation, domain: Domain, columns: list[str],
            budget: PrivacyCost) -> Shapes:
    """Noisy sub-bin histograms of ``columns`` within ``budget`` (equal parts)."""
    parts = budget.split([1] * len(columns))
    probabilities, measurements = {}, []
    for name, part in zip(columns, parts, strict=True):
        attribute = domain[name]
        cells = attribute.bins * SUB_BINS
        cells_of = source.query("_src", f"SELECT cell, count(*) FROM (SELECT "
                                f"{_sub_bin_sql(attribute)} AS cell FROM _src) "
                                "WHERE cell IS NOT NULL GROUP BY cell")
        assert cells_of is not None  # only a statement that writes yields no relation
        rows = cells_of.fetchall()
        counts = np.zeros(cells, dtype=np.int64)
        for cell, count in rows:
            counts[int(cell)] = int(count)
        measurement = measure_counts((name,), counts, part, domain.max_rows)
        measurements.append(measurement)
        probabilities[name] = _normalized(measurement.noisy.reshape(-1, SUB_BINS),
                                          widths(attribute))
    return Shapes(probabilities, measurements)


def _normalized(noisy: np.ndarray, holds: np.ndarray) -> list[list[float]]:
    """Each bin's noisy counts as probabilities: negatives and empty sub-bins zeroed.

    A bin with nothing left is uniform over its sub-bins that hold values.
    """
    kept = np.where(holds, np.maximum(noisy.astype(np.float64), 0.0), 0.0)
    totals = kept.sum(axis=1, keepdims=True)
    uniform = holds / holds.sum(axis=1, keepdims=True)
    return np.where(totals > 0, kept / np.where(totals > 0, totals, 1.0), uniform).tolist()
