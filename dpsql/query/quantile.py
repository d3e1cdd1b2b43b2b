"""DP quantiles (MEDIAN, PERCENTILE_CONT, QUANTILE_CONT, MIN, MAX): the exponential mechanism.

The column's declared bounds ``[lo, hi]`` are cut into a public grid of ``steps``
equal steps (the integers for an integer column spanning at most 2**14; else
2**14 steps), whose ``steps + 1`` points are the candidates. The database
clamps each value into the bounds and rounds it to its grid position, and
returns one histogram of positions per group (``histogram(pos)``): the sorted
clamped values, with their multiplicities. Candidate ``y`` is scored minus the
distance from ``q n`` to its ranks ``[#{x < y}, #{x <= y}]``: ``-|rank - q n|``
between values, as in Smith (2011)'s interval mechanism (every point of an
interval between two sorted values has the same score, so choosing a point is
choosing an interval, then a uniform point inside it), and 0 at a value whose
ties span ``q n``, so that all-equal values give that value.

Privacy: with ``q = a / D`` the integer score
``-max(D #{x < y} - a n, a n - D #{x <= y}, 0)`` moves by at most
``max(a, D - a)`` when one row is added or removed (``a n`` moves by ``a`` and
each rank by 0 or ``D``, both ranks alike unless the row equals ``y``), so by
``max_rows * max(a, D - a)`` for one privacy unit. Choosing a candidate with
probability proportional to ``exp(epsilon * score / (2 * sensitivity))`` is
epsilon-DP (McSherry & Talwar 2007) and, being epsilon-bounded-range,
(epsilon^2 / 8)-zCDP (Cesar & Rogers 2021).
:class:`dpsql.mechanisms.exponential.ExponentialMechanism` calibrates, prices and
samples it exactly (integer scores, the CSPRNG's Bernoulli(exp(-gamma))).
Groups are disjoint: a unit's rows in several groups move each group's scores
by its rows there, so the groups' losses add up to at most one group's
(parallel composition, in pure DP and in zCDP alike).

Accuracy: with probability at least ``1 - beta`` the answer's rank error (the
distance above, in rows) is within
``(2 max_rows max(q, 1 - q) / epsilon) (ln(steps + 1) + ln(1 / beta))`` rows of
the best candidate's (McSherry & Talwar's utility theorem), and the best
candidate is within half a grid step of the true quantile of the clamped values.
``MIN`` and ``MAX`` are the quantiles 0.01 and 0.99: at q = 0 every candidate
below the smallest value scores the same, so the answer would be uniform there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
from sqlglot import exp

from dpsql.domain import sql_literal
from dpsql.errors import ConfigurationError, QueryRejected
from dpsql.mechanisms.additive import Noise
from dpsql.mechanisms.exponential import ExponentialMechanism
from dpsql.privacy import Kind, PrivacyCost
from dpsql.query.dialect import reject

#: Grid steps over a column's bounds (an integer column spanning fewer uses its integers).
GRID_STEPS = 2**14
#: What MIN and MAX estimate: the quantiles 1/100 and 99/100 (see the module docstring).
MIN_Q, MAX_Q = Fraction(1, 100), Fraction(99, 100)
#: Most decimal places of a quantile literal (keeps the integer scores inside int64).
Q_DECIMALS = 6
#: Most groups one quantile query may have (each group costs a pass over the grid).
MAX_CELLS = 10_000
EXPONENTIAL = "exponential"
NONE = "none (unbounded budget)"


# -- parsing --------------------------------------------------------------------------------


def quantile_call(text: str, node: exp.Expr) -> tuple[str, exp.Expr, Fraction] | None:
    """(name, column argument, q) of a quantile aggregate; None for any other node.

    Accepted: ``MEDIAN(col)``, ``MIN(col)``, ``MAX(col)``, ``QUANTILE_CONT(col, q)``
    and ``PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY col)`` with a literal q in [0, 1],
    and their ``_DISC`` forms. Both answer with a point of the column's grid (an
    integer column's integers when its span is small): a DP answer is never
    interpolated between two data values, nor promised to be one.
    """
    if isinstance(node, exp.WithinGroup) and isinstance(node.this, PERCENTILES):
        name = _percentile_name(node.this)
        order = node.expression
        items = order.expressions if isinstance(order, exp.Order) else []
        if len(items) != 1 or items[0].args.get("desc"):
            raise reject(text, f"{name} takes one ascending ORDER BY column", node,
                         construct=name, advice=f"write {name}(0.9) "
                         "WITHIN GROUP (ORDER BY col), or 1 - q for a descending order")
        return name, items[0].this, _q(text, node.this.this, node)
    if isinstance(node, PERCENTILES):
        name = _percentile_name(node)
        if node.expression is None:
            raise reject(text, f"{name} needs WITHIN GROUP (ORDER BY col)", node,
                         construct=name,
                         advice=f"write {name}(0.9) WITHIN GROUP (ORDER BY col)")
        return name.replace("PERCENTILE", "QUANTILE"), node.this, _q(text, node.expression,
                                                                      node)
    fixed = {exp.Median: Fraction(1, 2), exp.Min: MIN_Q, exp.Max: MAX_Q}
    for kind, q in fixed.items():
        if type(node) is kind:
            extra = [k for k, v in node.args.items() if k != "this" and v]
            if extra:
                name = kind.__name__.upper()
                raise reject(text, f"{name} takes one column", node, construct=name,
                             advice=f"write {name}(col)")
            return kind.__name__.upper(), node.this, q
    return None


#: The SQL percentile functions; DISC answers like CONT (see :func:`quantile_call`).
PERCENTILES = (exp.PercentileCont, exp.PercentileDisc)


def _percentile_name(node: exp.Expr) -> str:
    return "PERCENTILE_DISC" if isinstance(node, exp.PercentileDisc) else "PERCENTILE_CONT"


def _q(text: str, node: exp.Expr | None, call: exp.Expr) -> Fraction:
    """The quantile literal, exactly; refused unless a number in [0, 1] with few decimals."""
    advice = "write a number between 0 and 1, such as 0.9"
    if not (isinstance(node, exp.Literal) and not node.is_string):
        raise reject(text, "the quantile must be a number written in the query", node or call,
                     construct="quantile", advice=advice)
    try:  # a Decimal keeps 1e-999999999 small; a Fraction of it would not be
        q = Decimal(node.this)
    except InvalidOperation:
        raise reject(text, "the quantile must be a plain number", node,
                     construct="quantile", advice=advice) from None
    if not 0 <= q <= 1:
        raise reject(text, f"the quantile {node.this} is outside [0, 1]", node,
                     construct="quantile", advice=advice)
    if q and _decimals(q) > Q_DECIMALS:
        raise reject(text, f"the quantile {node.this} has more than {Q_DECIMALS} decimals",
                     node, construct="quantile", advice="round it, e.g. 0.333333")
    return Fraction(q)


def _decimals(q: Decimal) -> int:
    """Decimal places of a finite ``q``, trailing zeros left out.

    Exact, unlike ``normalize()``, which rounds to 28 digits and flushes
    1e-999999999 to 0.
    """
    _, digits, exponent = q.as_tuple()
    assert isinstance(exponent, int)
    written = "".join(map(str, digits))
    return -exponent - (len(written) - len(written.rstrip("0")))


# -- the grid ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """``steps + 1`` public candidates ``lo + j (hi - lo) / steps`` over a column's bounds."""

    lo: Fraction
    hi: Fraction
    steps: int

    @classmethod
    def over(cls, bounds: tuple[float, float], integer: bool) -> Grid:
        """The grid of a column: its integers when few enough, else ``GRID_STEPS`` steps."""
        lo, hi = Fraction(bounds[0]), Fraction(bounds[1])
        span = hi - lo
        if integer and span.denominator == 1 and 0 < span <= GRID_STEPS:
            return cls(lo, hi, int(span))
        return cls(lo, hi, GRID_STEPS if span > 0 else 1)

    def position_sql(self, clamped: str, integer: bool) -> str:
        """SQL for the grid position (BIGINT in [0, steps]) of a value clamped into the bounds.

        Total: the clamped value is inside the bounds, so the cast cannot fail; NULL stays NULL.
        """
        if self.hi == self.lo:
            return f"(CASE WHEN {clamped} IS NULL THEN NULL ELSE 0 END)"
        if integer and self.steps == self.hi - self.lo:
            return f"(CAST({clamped} AS BIGINT) - {int(self.lo)})"
        scale = sql_literal(float(self.steps / (self.hi - self.lo)))
        offset = f"(CAST({clamped} AS DOUBLE) - {sql_literal(float(self.lo))}) * {scale}"
        return f"CAST(least(greatest(round({offset}), 0), {self.steps}) AS BIGINT)"

    def values(self, positions: np.ndarray) -> np.ndarray:
        """The candidates' values (float64) at grid ``positions``."""
        step = float((self.hi - self.lo) / self.steps)
        return float(self.lo) + positions.astype(np.float64) * step

    @property
    def step(self) -> float:
        """The distance between neighbouring candidates."""
        return float((self.hi - self.lo) / self.steps)


def scores(positions: np.ndarray, counts: np.ndarray, q: Fraction, steps: int) -> np.ndarray:
    """Integer score of every candidate 0..steps: ``-max(D #{x < y} - a n, a n - D #{x <= y}, 0)``.

    ``positions``: distinct grid positions of a group's values, ascending; ``counts``:
    how many values sit at each.
    """
    a, d = q.numerator, q.denominator
    y = np.arange(steps + 1, dtype=np.int64)
    n = int(counts.sum())
    below = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
    at = np.searchsorted(positions, y, side="left")
    less = below[at]
    equal = np.zeros_like(y)
    found = at < positions.size
    found[found] = positions[at[found]] == y[found]
    equal[found] = counts[at[found]]
    target = a * n
    return -np.maximum(np.maximum(d * less - target, target - d * (less + equal)), 0)


# -- the mechanism ----------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantileNoise:
    """The exponential mechanism of one quantile measure: q, grid, calibrated epsilon, share.

    ``sensitivity``: of the integer scores (``max_rows * max(a, D - a)``); ``epsilon``
    0 means no noise (an unbounded budget: the best candidate, the middle one on ties).
    """

    q: Fraction
    grid: Grid
    sensitivity: int
    epsilon: Fraction
    cost: PrivacyCost

    @classmethod
    def calibrate(cls, accounting: Kind, max_rows: int, q: Fraction, grid: Grid,
                  share: PrivacyCost, what: str) -> QuantileNoise:
        """The largest epsilon whose exponential mechanism fits in ``share`` (before any charge)."""
        sensitivity = max_rows * max(q.numerator, q.denominator - q.numerator)
        if share.infinite:
            return cls(q, grid, sensitivity, Fraction(0), share)
        try:  # the mechanism checks its privacy map against the share before it returns
            em = ExponentialMechanism.calibrate(sensitivity, share)
        except ConfigurationError as err:
            raise QueryRejected(f"the privacy cost is too small for {what}: {err}",
                                construct="privacy cost", advice="raise epsilon") from err
        return cls(q, grid, sensitivity, em.epsilon, share)

    @property
    def base(self) -> ExponentialMechanism | None:
        """The mechanism sampled, on integer scores (None without noise)."""
        return ExponentialMechanism(Fraction(self.sensitivity), self.epsilon) if self.noisy \
            else None

    @property
    def mechanism(self) -> str:
        """``exponential``, or none for an unbounded budget."""
        return EXPONENTIAL if self.noisy else NONE

    @property
    def noisy(self) -> bool:
        """False for the unbounded budget (the best candidate, no randomness)."""
        return self.epsilon > 0

    def check(self, d_in: int, d_out: PrivacyCost) -> bool:
        """Whether tables differing in ``d_in`` privacy units lose at most ``d_out``."""
        em = self.base
        if em is None:
            return d_out.infinite
        return em.check(d_in * self.sensitivity, d_out)

    def release(self, histograms: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """The chosen grid position of every cell (int64), from its histogram of positions."""
        em = self.base
        out = np.empty(len(histograms), dtype=np.int64)
        for i, (positions, counts) in enumerate(histograms):
            score = scores(positions, counts, self.q, self.grid.steps)
            if em is not None:
                out[i] = em.select(score)
            else:  # the middle of the best candidates
                best = np.flatnonzero(score == score.max())
                out[i] = (best[0] + best[-1]) // 2
        return out

    def rank_error(self, confidence: float) -> float:
        """Rank error (rows) beyond the best candidate's, exceeded w.p. at most 1 - confidence."""
        if not self.noisy:
            return 0.0
        per_row = self.sensitivity / float(self.q.denominator)  # max_rows * max(q, 1 - q)
        return 2 * per_row / float(self.epsilon) * (
            math.log(self.grid.steps + 1) + math.log(1 / (1 - confidence)))

    @property
    def scale(self) -> float:
        """Rows of rank error per e-fold drop in probability (0: no noise)."""
        if not self.noisy:
            return 0.0
        return 2 * self.sensitivity / float(self.q.denominator) / float(self.epsilon)

    def std(self) -> float | None:
        """No standard deviation in the answer's units: it depends on the private data."""
        return None if self.noisy else 0.0

    def halfwidth(self, confidence: float) -> float:
        """The accuracy in rows of rank (see :meth:`rank_error`)."""
        return self.rank_error(confidence)

    def describe(self, delta: float | None, confidence: float | None = None) -> dict[str, Any]:
        """JSON-able: mechanism, q, grid, epsilon, cost and the accuracy in rows of rank."""
        level = confidence or 0.95
        return {
            "mechanism": self.mechanism, "quantile": float(self.q),
            "sensitivity": self.sensitivity / self.q.denominator, "scale": self.scale,
            "std": self.std(), "grid_step": self.grid.step, "cost": self.cost.as_dict(delta),
            "confidence": level, "rank_error": self.rank_error(level),
            "accuracy": (f"with probability {level:g} the answer's rank is within "
                         f"{self.rank_error(level):.4g} rows of the {float(self.q):g} "
                         f"quantile's (grid step {self.grid.step:.4g})"),
        }

    def to_json(self) -> dict[str, Any]:
        """Exact, re-loadable form (for the answer cache)."""
        return {"mechanism": "quantile", "q": str(self.q),
                "grid": [str(self.grid.lo), str(self.grid.hi), self.grid.steps],
                "sensitivity": self.sensitivity, "epsilon": str(self.epsilon),
                "cost": [self.cost.kind, str(self.cost.units), self.cost.infinite]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QuantileNoise:
        """The inverse of :meth:`to_json`."""
        lo, hi, steps = data["grid"]
        kind, units, infinite = data["cost"]
        return cls(Fraction(data["q"]), Grid(Fraction(lo), Fraction(hi), int(steps)),
                   int(data["sensitivity"]), Fraction(data["epsilon"]),
                   PrivacyCost(kind, int(units), bool(infinite)))


def quantile_noise(cells: int, max_rows: int, q: Fraction, grid: Grid, accounting: Kind,
                   share: PrivacyCost) -> QuantileNoise:
    """The mechanism of one quantile measure of a query with ``cells`` public groups.

    Refuses (before any charge, from public facts) a query with more than
    ``MAX_CELLS`` groups: each group's selection is a pass over the grid.
    """
    if cells > MAX_CELLS:
        raise QueryRejected(f"a quantile over {cells} groups is more than the {MAX_CELLS} "
                            "allowed", construct="quantile",
                            advice="group by fewer or wider keys (dp_bin(col, WIDTH))")
    return QuantileNoise.calibrate(accounting, max_rows, q, grid, share, f"quantile {q}")


def histograms(column: Any, cells_of_rows: np.ndarray, keep: np.ndarray,
               cells: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each cell's (ascending distinct grid positions, counts) from the result's MAP column.

    ``keep`` marks the result rows inside the public key set and ``cells_of_rows`` gives
    their cells; rows of one cell (a key seen in two spellings) are merged.
    """
    maps = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    maps = pa.concat_arrays([maps]) if maps.offset else maps  # offsets index the children
    offsets = maps.offsets.to_numpy()
    keys = maps.keys.to_numpy(zero_copy_only=False).astype(np.int64)
    items = maps.items.to_numpy(zero_copy_only=False).astype(np.int64)
    valid = maps.is_valid().to_numpy(zero_copy_only=False)
    parts: list[list[int]] = [[] for _ in range(cells)]
    for row, cell in zip(np.flatnonzero(keep & valid), cells_of_rows[valid[keep]], strict=True):
        parts[cell].append(row)
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    out = []
    for rows in parts:
        if not rows:
            out.append(empty)
            continue
        pos = np.concatenate([keys[offsets[r]:offsets[r + 1]] for r in rows])
        cnt = np.concatenate([items[offsets[r]:offsets[r + 1]] for r in rows])
        distinct, where = np.unique(pos, return_inverse=True)
        counts = np.zeros(distinct.size, dtype=np.int64)
        np.add.at(counts, where, cnt)
        out.append((distinct, counts))
    return out


#: The noise of any measure: additive (counts, sums) or a quantile's selection.
MeasureNoise = Noise | QuantileNoise
