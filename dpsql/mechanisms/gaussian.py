"""The discrete Gaussian mechanism: integer noise on an integer vector of bounded L2 sensitivity.

Privacy: adding independent discrete Gaussian noise with variance parameter
``sigma^2`` to each coordinate of an integer vector whose L2 distance between
neighbouring datasets (one privacy unit added or removed) is at most ``Delta``
is ``Delta^2 / (2 sigma^2)``-zCDP (Canonne, Kamath & Steinke 2020, Thm 4). It
is not pure DP: a pure-DP budget cannot be charged for it. The squared
sensitivity is kept exactly, so a sensitivity that is a square root
(``max_rows sqrt(s)``, SDS's k-tuple counts) costs no rounding; the cost is
computed exactly from the sigma^2 the sampler really uses and rounded up once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql import noise
from dpsql.errors import ConfigurationError
from dpsql.mechanisms.base import positive, verified
from dpsql.privacy import Kind, Number, PrivacyCost, to_fraction

NAME = "discrete_gaussian"


@dataclass(frozen=True)
class GaussianMechanism:
    """Discrete Gaussian noise ``sigma2`` on a query of squared L2 sensitivity ``sensitivity2``.

    Privacy: (sensitivity2 / (2 sigma2))-zCDP under add/remove of one privacy
    unit (module docstring). sigma2 0 (an infinite budget) adds no noise.
    """

    sensitivity2: Fraction
    sigma2: Fraction
    name = NAME

    @classmethod
    def calibrate(cls, sensitivity: Number, cost: PrivacyCost) -> GaussianMechanism:
        """The smallest sigma^2 whose zCDP loss fits in ``cost``: exactly Delta^2 / (2 rho)."""
        return cls.calibrate_squared(positive(sensitivity, "sensitivity") ** 2, cost)

    @classmethod
    def calibrate_squared(cls, sensitivity2: Number, cost: PrivacyCost) -> GaussianMechanism:
        """As :meth:`calibrate`, from the squared L2 sensitivity (exact where Delta is not)."""
        sens2 = positive(sensitivity2, "squared sensitivity")
        if cost.kind != "zcdp":
            raise ConfigurationError(
                "Gaussian noise is not pure DP; use a policy with accounting: zcdp"
            )
        if cost.infinite:
            return cls(sens2, Fraction(0))
        if cost.is_zero:
            raise ConfigurationError("cannot calibrate a mechanism to a zero budget")
        mechanism = cls(sens2, sens2 / (2 * cost.value))
        return verified(mechanism, mechanism.check_squared(sens2, cost))

    @property
    def sensitivity(self) -> Fraction | float:
        """The L2 sensitivity: exact when ``sensitivity2`` is a rational square, else rounded up."""
        num, den = self.sensitivity2.numerator, self.sensitivity2.denominator
        root_num, root_den = math.isqrt(num), math.isqrt(den)
        if root_num**2 == num and root_den**2 == den:
            return Fraction(root_num, root_den)
        return math.nextafter(math.sqrt(self.sensitivity2), math.inf)

    @property
    def sigma(self) -> float:
        """The standard deviation parameter (sqrt of sigma2)."""
        return math.sqrt(self.sigma2)

    @property
    def rho(self) -> Fraction:
        """The exact zCDP loss at ``sensitivity`` (sigma2 must be positive)."""
        return self.sensitivity2 / (2 * self.sigma2)

    @property
    def param(self) -> Fraction:
        """The sampler's parameter: sigma^2 (0: no noise)."""
        return self.sigma2

    @property
    def noise_scale(self) -> float:
        """Sigma as a float (what accuracy formulas take)."""
        return self.sigma

    def used(self) -> GaussianMechanism:
        """This mechanism with the sigma^2 the sampler really uses (never smaller)."""
        if self.sigma2 == 0:
            return self
        return GaussianMechanism(self.sensitivity2, noise.used_gaussian_sigma2(self.sigma2))

    def cost(self, kind: Kind = "zcdp") -> PrivacyCost:
        """The zCDP loss of one run, rounded up; a pure-DP budget cannot be charged."""
        if kind != "zcdp":
            raise ConfigurationError("Gaussian noise cannot be charged to a pure-DP budget")
        if self.sigma2 == 0:
            return PrivacyCost.unbounded("zcdp")
        return PrivacyCost.from_fraction("zcdp", self.rho)

    def check(self, d_in: Number, d_out: PrivacyCost) -> bool:
        """Whether neighbours at L2 distance ``d_in`` lose at most ``d_out`` (zCDP)."""
        return self.check_squared(to_fraction(d_in, "d_in") ** 2, d_out)

    def check_squared(self, d_in2: Number, d_out: PrivacyCost) -> bool:
        """As :meth:`check`, for neighbours at squared L2 distance ``d_in2``."""
        if d_out.kind != "zcdp":
            return False
        if self.sigma2 == 0:
            return d_out.infinite
        if d_out.infinite:
            return True
        return to_fraction(d_in2, "d_in^2") / (2 * self.sigma2) <= d_out.value

    def release(self, values: np.ndarray) -> np.ndarray:
        """``values`` (an integer array) plus fresh noise from the exact sampler; int64."""
        if self.sigma2 == 0:
            return np.asarray(values).astype(np.int64)
        return noise.add_discrete_gaussian(values, self.sigma2)
