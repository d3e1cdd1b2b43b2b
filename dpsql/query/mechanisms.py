"""The noise each measure of a query gets: calibrated, recorded as used, and its accuracy.

Every measure is an integer vector (counts, or sums in fixed-point grid units
of ``2**exponent``), so the exact discrete samplers of :mod:`dpsql.noise` apply
directly. The recorded parameter is the one the sampler really uses (rounded
up, never down).

Privacy: one privacy unit contributes at most ``max_rows`` rows to the bounded
source, each changing a count vector by 1 (a distinct count by at most 1: the
row's value may be the only one of its kind in its cell) and a sum vector by at
most ``per_row`` grid units, in one cell. The vector's sensitivity is therefore
``max_rows * per_row`` in L1 and at most that in L2. Under ``pure`` accounting
a measure gets discrete Laplace noise of scale sensitivity/epsilon_share
(epsilon_share-DP, Ghosh, Roughgarden & Sundararajan 2009); under ``zcdp``
discrete Gaussian noise with sigma^2 = sensitivity^2 / (2 rho_share)
(rho_share-zCDP, Canonne, Kamath & Steinke 2020, Thm 4). The shares of a
query's measures sum to at most its cost (sequential composition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpsql import noise
from dpsql.errors import ConfigurationError, InternalError, QueryRejected
from dpsql.privacy import GaussianMechanism, Kind, LaplaceMechanism, PrivacyCost

NONE = "none (unbounded budget)"


@dataclass(frozen=True)
class Noise:
    """Noise for one measure: mechanism, sensitivity and parameter in grid units, its share."""

    mechanism: str
    sensitivity: int
    param: Fraction  # Laplace scale, or Gaussian sigma^2, in grid units (0: no noise)
    exponent: int  # one grid unit is 2**exponent in the answer's units
    cost: PrivacyCost

    @classmethod
    def calibrate(cls, accounting: Kind, sensitivity: int, exponent: int,
                  share: PrivacyCost, what: str) -> Noise:
        """The least noise whose loss fits in ``share``; refuses noise the sampler cannot draw.

        Runs before any charge, so a refusal here costs nothing.
        """
        if share.infinite:
            return cls(NONE, sensitivity, Fraction(0), exponent, share)
        try:
            if accounting == "pure":
                laplace = LaplaceMechanism.calibrate(sensitivity, share)
                used = noise.used_laplace_scale(laplace.scale)
                ok = LaplaceMechanism(laplace.sensitivity, used).check(sensitivity, share)
                name = "discrete_laplace"
            else:
                gauss = GaussianMechanism.calibrate(sensitivity, share)
                used = noise.used_gaussian_sigma2(gauss.sigma2)
                ok = GaussianMechanism(gauss.sensitivity, used).check(sensitivity, share)
                name = "discrete_gaussian"
        except ConfigurationError as err:
            raise QueryRejected(f"the privacy cost is too small for {what}: {err}",
                                construct="privacy cost",
                                advice="raise epsilon, or aggregate fewer columns at once") from err
        if not ok:
            raise InternalError(f"calibrated noise for {what} does not meet its share; "
                                "this is a bug in dpsql")
        return cls(name, sensitivity, used, exponent, share)

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
