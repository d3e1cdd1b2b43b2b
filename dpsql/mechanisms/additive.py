"""Additive noise on counts and fixed-point sums: the policy's discrete Laplace or Gaussian.

Every count or sum dpsql releases (a SQL query's measures, a synthesizer's
marginals) is an integer vector: counts, or sums in fixed-point grid units of
``2**exponent`` (:class:`dpsql.noise.FixedPoint`), so the exact discrete
samplers of :mod:`dpsql.noise` apply directly. :func:`additive` picks the
mechanism the policy's accounting calls for and calibrates it to a share;
:class:`Noise` records it for one measure of a query (parameter as sampled,
grid, share) with its accuracy in the answer's units.

Privacy: under ``pure`` accounting a vector of L1 sensitivity ``Delta`` gets
discrete Laplace noise of scale Delta / epsilon_share (epsilon_share-DP,
:mod:`dpsql.mechanisms.laplace`); under ``zcdp`` discrete Gaussian noise with
sigma^2 = Delta^2 / (2 rho_share) (rho_share-zCDP,
:mod:`dpsql.mechanisms.gaussian`), Delta bounding the L2 sensitivity too (it is
at most the L1). The parameter is rounded up to what the sampler draws and
the privacy map checked again at that value. For a query: one privacy unit
contributes at most ``max_rows`` rows to the bounded source, each changing a
count vector by 1 (a distinct count by at most 1: the row's value may be the
only one of its kind in its cell) and a sum vector by at most ``per_row`` grid
units, in one cell, so ``Delta = max_rows * per_row``. The shares of a query's
measures sum to at most its cost (sequential composition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpsql import noise
from dpsql.mechanisms.base import verified
from dpsql.mechanisms.gaussian import GaussianMechanism
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.privacy import Kind, Number, PrivacyCost

NONE = "none (unbounded budget)"

Additive = LaplaceMechanism | GaussianMechanism


def additive(accounting: Kind, sensitivity: Number, share: PrivacyCost) -> Additive:
    """The least noise for a vector of L1 (and L2) ``sensitivity`` whose loss fits in ``share``.

    Discrete Laplace under ``pure``, discrete Gaussian under ``zcdp``; the
    parameter the sampler really uses, checked against ``share`` (no noise for
    an infinite share). ConfigurationError for a share too small to sample.
    """
    mechanism: Additive
    if accounting == "pure":
        mechanism = LaplaceMechanism.calibrate(sensitivity, share).used()
    else:
        mechanism = GaussianMechanism.calibrate(sensitivity, share).used()
    return verified(mechanism, mechanism.check(sensitivity, share))


@dataclass(frozen=True)
class Noise:
    """Noise for one measure: mechanism, sensitivity and parameter in grid units, its share.

    ``cost`` is the share the measure was calibrated to (and charged); its loss,
    ``base.cost(kind)``, is at most that, as :meth:`calibrate` checked.
    """

    mechanism: str
    sensitivity: int
    param: Fraction  # Laplace scale, or Gaussian sigma^2, in grid units (0: no noise)
    exponent: int  # one grid unit is 2**exponent in the answer's units
    cost: PrivacyCost

    @classmethod
    def calibrate(cls, accounting: Kind, sensitivity: int, exponent: int,
                  share: PrivacyCost) -> Noise:
        """The least noise whose loss fits in ``share`` (:func:`additive`).

        ConfigurationError for noise the sampler cannot draw: the caller refuses
        the query before any charge, so a refusal costs nothing.
        """
        if share.infinite:
            return cls(NONE, sensitivity, Fraction(0), exponent, share)
        base = additive(accounting, sensitivity, share)
        return cls(base.name, sensitivity, base.param, exponent, share)

    @property
    def base(self) -> Additive | None:
        """The mechanism sampled, on grid units (None without noise)."""
        if not self.noisy:
            return None
        if self.mechanism == LaplaceMechanism.name:
            return LaplaceMechanism(Fraction(self.sensitivity), self.param)
        return GaussianMechanism(Fraction(self.sensitivity) ** 2, self.param)

    def check(self, d_in: int, d_out: PrivacyCost) -> bool:
        """Whether tables differing in ``d_in`` privacy units lose at most ``d_out``."""
        base = self.base
        if base is None:
            return d_out.infinite
        return base.check(d_in * self.sensitivity, d_out)

    @property
    def grid(self) -> Fraction:
        """One grid unit in the answer's units (exactly)."""
        return Fraction(2) ** self.exponent

    @property
    def noisy(self) -> bool:
        """False for the unbounded budget (no noise at all)."""
        return self.mechanism != NONE

    @property
    def unit_scale(self) -> float:
        """Laplace scale or Gaussian sigma, in grid units."""
        if not self.noisy:
            return 0.0
        if self.mechanism == "discrete_laplace":
            return float(self.param)
        return math.sqrt(self.param)

    @property
    def scale(self) -> float:
        """Laplace scale or Gaussian sigma, in the answer's units."""
        return self.unit_scale * float(self.grid)

    def sample(self, size: int) -> np.ndarray:
        """``size`` fresh draws (int64 grid units) from the secure sampler; zeros if no noise.

        Noise depends on no data, so it may be drawn before the query runs.
        """
        if not self.noisy:
            return np.zeros(size, dtype=np.int64)
        if self.mechanism == "discrete_laplace":
            return noise.discrete_laplace(self.param, size)
        return noise.discrete_gaussian(self.param, size)

    def release(self, exact: np.ndarray) -> np.ndarray:
        """The noisy vector: ``exact`` plus fresh noise (what a quantile selects instead)."""
        return exact + self.sample(exact.size)

    def std(self) -> float:
        """Standard deviation of the noise in the answer's units."""
        if not self.noisy:
            return 0.0
        return noise.std(self.mechanism, self.unit_scale) * float(self.grid)

    def halfwidth(self, confidence: float) -> float:
        """Half-width of a ``confidence`` interval for the noise, in the answer's units."""
        if not self.noisy:
            return 0.0
        return noise.ci_halfwidth(self.mechanism, self.unit_scale, confidence) * float(self.grid)

    def halfwidth_bound(self, confidence: float) -> float:
        """An upper bound on :meth:`halfwidth` that costs next to nothing.

        Exact for Laplace (a closed form); for the discrete Gaussian, its
        sub-Gaussian tail P(|Z| >= t) <= 2 exp(-t^2 / (2 sigma^2)) (Canonne,
        Kamath & Steinke 2020, Cor. 9), where the exact half-width sums the pmf
        (up to 10 ms). Used to skip that sum when no answer is near its noise.
        """
        if self.mechanism != "discrete_gaussian":
            return self.halfwidth(confidence)
        units = math.ceil(self.unit_scale * math.sqrt(2 * math.log(2 / (1 - confidence))))
        return units * float(self.grid)

    def describe(self, delta: float | None, confidence: float | None = None) -> dict[str, Any]:
        """JSON-able: mechanism, scale, expected error, cost (both units)."""
        out: dict[str, Any] = {
            "mechanism": self.mechanism,
            "sensitivity": float(self.sensitivity * self.grid),
            "scale": self.scale,
            "std": self.std(),
            "cost": self.cost.as_dict(delta),
        }
        if confidence is not None:
            out["confidence"] = confidence
            out["ci_halfwidth"] = self.halfwidth(confidence)
        return out

    def to_json(self) -> dict[str, Any]:
        """Exact, re-loadable form (for the answer cache)."""
        return {"mechanism": self.mechanism, "sensitivity": self.sensitivity,
                "param": str(self.param), "exponent": self.exponent,
                "cost": [self.cost.kind, str(self.cost.units), self.cost.infinite]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Noise:
        """The inverse of :meth:`to_json`."""
        kind, units, infinite = data["cost"]
        return cls(data["mechanism"], int(data["sensitivity"]), Fraction(data["param"]),
                   int(data["exponent"]), PrivacyCost(kind, int(units), bool(infinite)))
