"""The discrete Laplace mechanism: integer noise on an integer vector of bounded L1 sensitivity.

Privacy: adding independent discrete Laplace noise of scale ``b`` to each
coordinate of an integer vector whose L1 distance between neighbouring datasets
(one privacy unit added or removed) is at most ``Delta`` is ``(Delta / b)``-DP
(the geometric mechanism, Ghosh, Roughgarden & Sundararajan 2009; Canonne,
Kamath & Steinke 2020, Sec. 2.2). Pure epsilon-DP implies (epsilon^2 / 2)-zCDP
(Bun & Steinke 2016, Prop. 1.4), which is what a zCDP budget is charged. Both
costs are computed exactly from the scale the sampler really uses and rounded
up once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql import noise
from dpsql.errors import ConfigurationError
from dpsql.mechanisms.base import loss_fits, positive, verified
from dpsql.privacy import Kind, Number, PrivacyCost, to_fraction

NAME = "discrete_laplace"


@dataclass(frozen=True)
class LaplaceMechanism:
    """Discrete Laplace noise of ``scale`` on an integer query of L1 ``sensitivity``.

    Privacy: (sensitivity / scale)-DP under add/remove of one privacy unit;
    charged to a zCDP budget as (sensitivity/scale)^2 / 2 (module docstring).
    Scale 0 (an infinite budget) adds no noise and promises nothing finite.
    """

    sensitivity: Fraction
    scale: Fraction
    name = NAME

    @classmethod
    def calibrate(cls, sensitivity: Number, cost: PrivacyCost) -> LaplaceMechanism:
        """The smallest scale whose loss fits in ``cost`` (scale 0 for an infinite cost)."""
        sens = positive(sensitivity, "sensitivity")
        if cost.infinite:
            return cls(sens, Fraction(0))
        if cost.is_zero:
            raise ConfigurationError("cannot calibrate a mechanism to a zero budget")
        if cost.kind == "pure":
            mechanism = cls(sens, sens / cost.value)
        else:  # epsilon = sqrt(2 rho), rounded down so the scale rounds up.
            eps = PrivacyCost.from_fraction("pure", Fraction(math.sqrt(2 * cost.value)),
                                            round_up=False)
            while eps.value**2 / 2 > cost.value:
                eps = PrivacyCost("pure", eps.units - 1)
            mechanism = cls(sens, sens / eps.value)
        return verified(mechanism, mechanism.check(sens, cost))

    @property
    def epsilon(self) -> Fraction:
        """The exact pure-DP loss at ``sensitivity`` (the scale must be positive)."""
        return self.sensitivity / self.scale

    @property
    def param(self) -> Fraction:
        """The sampler's parameter: the scale (0: no noise)."""
        return self.scale

    @property
    def noise_scale(self) -> float:
        """The scale as a float (what accuracy formulas take)."""
        return float(self.scale)

    def used(self) -> LaplaceMechanism:
        """This mechanism with the scale the sampler really draws with (never smaller)."""
        if self.scale == 0:
            return self
        return LaplaceMechanism(self.sensitivity, noise.used_laplace_scale(self.scale))

    def cost(self, kind: Kind = "pure") -> PrivacyCost:
        """The loss of one run, in ``kind`` accounting: epsilon, or epsilon^2 / 2, rounded up."""
        if self.scale == 0:
            return PrivacyCost.unbounded(kind)
        if kind == "pure":
            return PrivacyCost.from_fraction("pure", self.epsilon)
        return PrivacyCost.from_fraction("zcdp", self.epsilon**2 / 2)

    def check(self, d_in: Number, d_out: PrivacyCost) -> bool:
        """Whether neighbours at L1 distance ``d_in`` lose at most ``d_out``."""
        if self.scale == 0:
            return d_out.infinite
        return loss_fits(to_fraction(d_in, "d_in") / self.scale, d_out)

    def release(self, values: np.ndarray) -> np.ndarray:
        """``values`` (an integer array) plus fresh noise from the exact sampler; int64."""
        if self.scale == 0:
            return np.asarray(values).astype(np.int64)
        return noise.add_discrete_laplace(values, self.scale)
