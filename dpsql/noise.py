"""Exact discrete noise for DP answers, and the accuracy of that noise.

Samplers: the discrete Laplace and discrete Gaussian of Canonne, Kamath and
Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020),
implemented with integer arithmetic only, vectorized over numpy arrays and
driven by the OS CSPRNG (see :mod:`dpsql._exact`). Floating-point noise leaks
through its low bits; integer noise on an integer answer does not. OpenDP has
the same samplers, but they took 5-9 s per million counts here against well
under 1 s for this module (``benchmarks/noise_throughput.py``), which is why
dpsql carries its own.

Parameters (a Laplace scale, a Gaussian sigma^2) arrive as ``Fraction``,
``int`` or ``float`` (floats are read exactly with ``Fraction(x)``) and are
rounded *up* to the integer representation the sampler uses: more noise is
always safe. ``used_laplace_scale`` / ``used_gaussian_sigma2`` return the value
really used, to the bit, so callers can record it; it is exact for simple
fractions and otherwise at most ~2**-20 (relative) above the request. Values
below 2**-16 are raised to 2**-16 (noise that is zero with probability at
least 1 - e**-30000 either way).

Fixed-point path for bounded real-valued sums: with ``fp = FixedPoint.for_bound(B)``
the SQL layer computes ``SUM(round(clamp(x, -B, B) / fp.grid))``, an exact
integer of grid units; the caller adds integer noise calibrated to
``fp.sensitivity_units(B)`` (times the rows a privacy unit may contribute) and
converts the noisy total back with ``fp.from_units``. The grid is a power of
two so that ``to_units`` / ``from_units`` are exact in binary floating point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import overload

import numpy as np

from dpsql import _exact
from dpsql.errors import ConfigurationError

Number = Fraction | int | float

#: Smallest Laplace scale / Gaussian sigma^2 the samplers use; smaller requests are raised to it.
MIN_LAPLACE_SCALE = Fraction(1, 2**16)
MIN_GAUSSIAN_SIGMA2 = Fraction(1, 2**16)
#: Largest Laplace scale (keeps t * geometric counts inside int64).
MAX_LAPLACE_SCALE = 2**40
#: Largest Gaussian sigma: above it d^2 = (|Y| c_den - c_num)^2 no longer fits int64 for typical Y.
MAX_GAUSSIAN_SIGMA = 5 * 10**7

_T_BITS = 24  # inexact Laplace scales: t in [2**23, 2**24), relative rounding < 2**-23
_C_BITS = 21  # inexact Gaussian c: c_num in [2**20, 2**21), relative rounding < 2**-20
_EXACT_LIMIT = 2**40
_DEN_LIMIT = 2**58
_PMF_SUM_MAX_SIGMA = 20_000.0  # above this the discrete Gaussian CI uses the normal tail
_MECHANISMS = ("discrete_laplace", "discrete_gaussian")


def _as_fraction(value: object, what: str) -> Fraction:
    """Read a positive finite parameter exactly, or raise ConfigurationError."""
    if isinstance(value, np.integer):
        value = int(value)
    elif isinstance(value, np.floating):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise ConfigurationError(
            f"{what} must be a number (int, float or Fraction), got {type(value).__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigurationError(f"{what} must be finite, got {value}; check the budget split")
    x = Fraction(value)
    if x <= 0:
        raise ConfigurationError(f"{what} must be positive, got {value}")
    return x


def _floor_log2(x: Fraction) -> int:
    """Return the integer e with 2**e <= x < 2**(e+1), for x > 0."""
    e = x.numerator.bit_length() - x.denominator.bit_length()
    return e if Fraction(2) ** e <= x else e - 1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _as_size(size: object) -> int:
    if isinstance(size, np.integer):
        size = int(size)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ConfigurationError(f"size must be a non-negative int, got {size!r}")
    return size


def _laplace_ts(scale: object) -> tuple[int, int]:
    """Return (t, s) with t/s the smallest representable scale >= ``scale``."""
    x = _as_fraction(scale, "Laplace scale")
    if x > MAX_LAPLACE_SCALE:
        raise ConfigurationError(
            f"Laplace scale {float(x):.4g} exceeds {MAX_LAPLACE_SCALE:.4g}: this budget is too"
            " small to give a useful answer; raise epsilon or tighten the bounds"
        )
    x = max(x, MIN_LAPLACE_SCALE)
    if x.numerator <= _EXACT_LIMIT and x.denominator <= _EXACT_LIMIT:
        return x.numerator, x.denominator
    k = max(0, _T_BITS - 1 - _floor_log2(x))
    t = math.ceil(x * 2**k)
    return Fraction(t, 2**k).numerator, Fraction(t, 2**k).denominator


def _gaussian_params(sigma2: object) -> tuple[int, int, int]:
    """Return (t, c_num, c_den), sigma^2 = t c_num / c_den the smallest representable >= sigma2."""
    x = _as_fraction(sigma2, "Gaussian sigma^2")
    if x > MAX_GAUSSIAN_SIGMA**2:
        raise ConfigurationError(
            f"Gaussian sigma {math.sqrt(x):.4g} exceeds {MAX_GAUSSIAN_SIGMA:.4g}: this budget is"
            " too small to give a useful answer; raise rho (or epsilon) or tighten the bounds"
        )
    x = max(x, MIN_GAUSSIAN_SIGMA2)
    params = _gaussian_repr(x)
    while True:  # settle on a value that represents itself, so used(used(x)) == used(x)
        value = Fraction(params[0] * params[1], params[2])
        again = _gaussian_repr(value)
        if Fraction(again[0] * again[1], again[2]) == value:
            return again
        params = again  # rounding crossed a step of t; at most a couple of rounds


def _gaussian_repr(x: Fraction) -> tuple[int, int, int]:
    # Any integer t >= 1 is exact; CKS take floor(sigma) + 1, round(sigma) accepts more often.
    t = max(1, (math.isqrt(math.floor(4 * x)) + 1) // 2)
    c = x / t
    if c.numerator <= 2**31 and 2 * c.numerator * c.denominator * t <= _DEN_LIMIT:
        return t, c.numerator, c.denominator
    k = max(0, _C_BITS - 1 - _floor_log2(c))
    reduced = Fraction(math.ceil(c * 2**k), 2**k)
    return t, reduced.numerator, reduced.denominator


def used_laplace_scale(scale: Number) -> Fraction:
    """Return the exact scale ``discrete_laplace(scale, n)`` samples with (>= ``scale``)."""
    t, s = _laplace_ts(scale)
    return Fraction(t, s)


def used_gaussian_sigma2(sigma2: Number) -> Fraction:
    """Return the exact sigma^2 ``discrete_gaussian(sigma2, n)`` uses (>= ``sigma2``)."""
    t, c_num, c_den = _gaussian_params(sigma2)
    return Fraction(t * c_num, c_den)


def discrete_laplace(scale: Number, size: int) -> np.ndarray:
    """Draw ``size`` int64 values with P(z) proportional to exp(-|z| / scale).

    Privacy: adding ``discrete_laplace(Δ/ε)`` to an integer query of L1
    sensitivity Δ is ε-DP (CKS 2020, Section 2.2; geometric mechanism of Ghosh,
    Roughgarden and Sundararajan 2009). The scale is rounded up, see
    ``used_laplace_scale``; at most 2**40.
    """
    t, s = _laplace_ts(scale)
    return _exact.discrete_laplace(t, s, _as_size(size))


def discrete_gaussian(sigma2: Number, size: int) -> np.ndarray:
    """Draw ``size`` int64 values with P(z) proportional to exp(-z^2 / (2 sigma2)).

    Privacy: adding ``discrete_gaussian(Δ²/(2 rho))`` to an integer query of L2
    sensitivity Δ is rho-zCDP (CKS 2020, Thm 4). sigma^2 is rounded up, see
    ``used_gaussian_sigma2``. The int64 path supports sigma up to 5e7
    (``MAX_GAUSSIAN_SIGMA``); larger values raise ConfigurationError.
    """
    t, c_num, c_den = _gaussian_params(sigma2)
    return _exact.discrete_gaussian(t, c_num, c_den, _as_size(size))


def _as_counts(counts: np.ndarray) -> np.ndarray:
    arr = np.asarray(counts)
    if arr.dtype.kind not in "iu":
        raise ConfigurationError(
            f"noise is added to integer arrays only, got dtype {arr.dtype}; convert real"
            " values to grid units with FixedPoint.to_units first"
        )
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) >= 2**63:
        raise ConfigurationError("counts above 2**63 - 1 cannot be noised in int64")
    return arr.astype(np.int64)


def add_discrete_laplace(counts: np.ndarray, scale: Number) -> np.ndarray:
    """Add independent discrete Laplace noise to ``counts`` (any integer array); int64.

    Privacy: ε-DP when ``scale`` = Δ/ε and the vector of counts has L1
    sensitivity Δ (a histogram under add/remove of one row: Δ = 1).
    """
    arr = _as_counts(counts)
    return arr + discrete_laplace(scale, arr.size).reshape(arr.shape)


def add_discrete_gaussian(counts: np.ndarray, sigma2: Number) -> np.ndarray:
    """Add independent discrete Gaussian noise to ``counts`` (any integer array); int64.

    Privacy: rho-zCDP when ``sigma2`` = Δ²/(2 rho) and the vector of counts has L2
    sensitivity Δ (CKS 2020, Thm 4).
    """
    arr = _as_counts(counts)
    return arr + discrete_gaussian(sigma2, arr.size).reshape(arr.shape)


@dataclass(frozen=True)
class FixedPoint:
    """A power-of-two grid on which bounded real values are summed exactly as integers.

    Privacy: a value clamped to [-B, B] rounds to at most
    ``sensitivity_units(B)`` grid units in absolute value (for round-to-nearest
    in either tie convention), so that is the per-row sensitivity of the sum in
    grid units.
    """

    exponent: int  # grid = 2**exponent

    def __post_init__(self) -> None:
        if isinstance(self.exponent, bool) or not isinstance(self.exponent, int):
            raise ConfigurationError(f"FixedPoint exponent must be an int, got {self.exponent!r}")
        if abs(self.exponent) > 900:
            raise ConfigurationError(f"FixedPoint exponent {self.exponent} is out of range")

    @classmethod
    def for_bound(cls, bound: float, units: int = 2**16) -> FixedPoint:
        """Pick the finest power-of-two grid on which |bound| spans at most ``units`` steps."""
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ConfigurationError(f"units must be a positive int, got {units!r}")
        ratio = abs(_as_bound(bound)) / units
        e = _floor_log2(ratio)
        return cls(e if Fraction(2) ** e == ratio else e + 1)

    @property
    def grid(self) -> Fraction:
        """The grid step 2**exponent, exactly."""
        return Fraction(2) ** self.exponent

    @overload
    def to_units(self, x: float) -> int: ...
    @overload
    def to_units(self, x: np.ndarray) -> np.ndarray: ...
    def to_units(self, x: float | np.ndarray) -> int | np.ndarray:
        """Round ``x`` to the nearest grid point (ties to even), in grid units."""
        arr = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(arr)):
            raise ConfigurationError("to_units needs finite values; filter NULL/NaN first")
        units = np.rint(np.ldexp(arr, -self.exponent))
        if np.any(np.abs(units) >= 2.0**63):
            raise ConfigurationError("value too large for this grid; use a coarser FixedPoint")
        out = units.astype(np.int64)
        return int(out) if out.ndim == 0 else out

    @overload
    def from_units(self, u: int) -> float: ...
    @overload
    def from_units(self, u: np.ndarray) -> np.ndarray: ...
    def from_units(self, u: int | np.ndarray) -> float | np.ndarray:
        """Grid units back to real values (exact while |u| < 2**53)."""
        out = np.ldexp(np.asarray(u, dtype=np.float64), self.exponent)
        return float(out) if out.ndim == 0 else out

    def sensitivity_units(self, bound: float) -> int:
        """ceil(|bound| / grid): the largest |to_units(x)| for x in [-|bound|, |bound|]."""
        ratio = abs(_as_bound(bound)) / self.grid
        return _ceil_div(ratio.numerator, ratio.denominator)


def _as_bound(bound: object) -> Fraction:
    if isinstance(bound, (int, float, Fraction, np.integer, np.floating)) and bound != 0:
        return _as_fraction(abs(bound), "bound")
    raise ConfigurationError(f"bound must be a non-zero finite number, got {bound!r}")


def _check_accuracy_args(mechanism: str, scale: float) -> float:
    if mechanism not in _MECHANISMS:
        raise ConfigurationError(f"unknown mechanism {mechanism!r}; use one of {_MECHANISMS}")
    return float(_as_fraction(scale, "scale"))


def _gaussian_weights(sigma: float) -> np.ndarray:
    """exp(-z^2 / (2 sigma^2)) for z = 0, 1, ... until it underflows."""
    zmax = math.ceil(sigma * math.sqrt(2 * 750)) + 1
    z = np.arange(zmax + 1, dtype=np.float64)
    return np.exp(-(z * z) / (2 * sigma * sigma))


def _laplace_log_tail(k: int, b: float) -> float:
    """Return log P(|Z| > k) = log 2 - (k+1)/b - log(1 + e^{-1/b}) (discrete Laplace)."""
    return math.log(2) - (k + 1) / b - math.log1p(math.exp(-1 / b))


def ci_halfwidth(mechanism: str, scale: float, confidence: float) -> float:
    """Return the smallest integer k with P(|Z| <= k) >= ``confidence`` for the noise Z.

    ``scale`` is the Laplace scale or the Gaussian sigma (not sigma^2); pass
    the used value (``used_laplace_scale``, sqrt of ``used_gaussian_sigma2``).
    Discrete Laplace uses the closed form; the discrete Gaussian sums its pmf
    (for sigma above 2e4, the normal tail with continuity correction, which is
    off by at most one unit).
    """
    sc = _check_accuracy_args(mechanism, scale)
    if isinstance(confidence, bool) or not 0 < confidence < 1:
        raise ConfigurationError(f"confidence must be in (0, 1), got {confidence!r}")
    q = 1.0 - confidence
    if mechanism == "discrete_laplace":
        log_q = math.log(q)
        k = max(0, math.ceil(sc * (math.log(2) - math.log1p(math.exp(-1 / sc)) - log_q)) - 1)
        while k > 0 and _laplace_log_tail(k - 1, sc) <= log_q:
            k -= 1
        while _laplace_log_tail(k, sc) > log_q:
            k += 1
        return float(k)
    if sc > _PMF_SUM_MAX_SIGMA:
        z = -NormalDist().inv_cdf(q / 2)
        return float(max(0, math.ceil(sc * z - 0.5)))
    w = _gaussian_weights(sc)
    total = w[0] + 2 * w[1:].sum()
    tail = 2 * np.concatenate((np.cumsum(w[::-1])[::-1][1:], [0.0])) / total  # P(|Z| > k)
    return float(np.flatnonzero(tail <= q)[0])


def std(mechanism: str, scale: float) -> float:
    """Return the standard deviation of the noise (given the Laplace scale or Gaussian sigma)."""
    sc = _check_accuracy_args(mechanism, scale)
    if mechanism == "discrete_laplace":
        return math.sqrt(2 * math.exp(-1 / sc)) / -math.expm1(-1 / sc)
    if sc > 100:
        return sc  # the discrete and continuous variances differ by ~exp(-2 pi^2 sigma^2)
    w = _gaussian_weights(sc)
    z = np.arange(w.size, dtype=np.float64)
    return math.sqrt(2 * float((z * z * w).sum()) / (w[0] + 2 * w[1:].sum()))


__all__ = [
    "MAX_GAUSSIAN_SIGMA",
    "MAX_LAPLACE_SCALE",
    "MIN_GAUSSIAN_SIGMA2",
    "MIN_LAPLACE_SCALE",
    "FixedPoint",
    "add_discrete_gaussian",
    "add_discrete_laplace",
    "ci_halfwidth",
    "discrete_gaussian",
    "discrete_laplace",
    "std",
    "used_gaussian_sigma2",
    "used_laplace_scale",
]
