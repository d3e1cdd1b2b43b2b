"""zCDP cost of DP-SGD from Google's ``dp-accounting`` RDP accountant, charged conservatively.

Each step releases the clipped gradient sum plus discrete Gaussian noise of
variance ``sigma2`` (grid units) on an integer vector of L2 sensitivity
``delta`` (grid units). The discrete Gaussian's Renyi divergence at every order
is at most the continuous Gaussian's for integer shifts (Canonne, Kamath &
Steinke 2020, sec. 4), so the accountant's Gaussian curve with noise multiplier
``z = sqrt(sigma2) / delta`` bounds it.

Conversion to zCDP: rho = sup over orders a > 1 of RDP(a) / a.
- Full batch: RDP(a) = a T / (2 z^2), so the ratio is the same at every order
  and the accountant's maximum over its orders is exactly rho = T / (2 z^2).
- Poisson subsampling at rate q: zCDP does not amplify. The subsampled curve
  is dominated by the unsampled one at every order (joint convexity of
  exp((a-1) D_a)), and its RDP(a)/a tends to T/(2 z^2) as a grows (the
  accountant's own curve shows it), so its sup over all orders is the
  unsampled figure, and that is what is charged. (The accountant's subsampled
  curve at its finite list of orders would under-count; at fractional orders
  near 1 its bounds are loose enough to over-count.) Poisson batches buy speed
  per step, never privacy, under a zCDP ledger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import rdp

from dpsql.errors import ConfigurationError
from dpsql.mechanisms.gaussian import GaussianMechanism
from dpsql.privacy import PrivacyCost

FLOAT_MARGIN = Fraction(1, 10**12)  # relative round-up of the accountant's float figure


@dataclass(frozen=True)
class StepNoise:
    """Noise of one DP-SGD step: variance ``sigma2`` on a query of sensitivity ``delta``."""

    sigma2: Fraction  # grid units squared, exactly what the sampler uses
    delta: Fraction  # L2 sensitivity in grid units

    @property
    def multiplier(self) -> float:
        """The noise multiplier z = sigma / delta."""
        return math.sqrt(float(self.sigma2 / self.delta**2))

    @property
    def gaussian(self) -> GaussianMechanism:
        """One step as the discrete Gaussian mechanism: delta^2 / (2 sigma2)-zCDP."""
        return GaussianMechanism(self.delta**2, self.sigma2)


def _max_ratio(event: dp_accounting.DpEvent) -> float:
    accountant = rdp.RdpAccountant()
    accountant.compose(event)
    curve = np.asarray(accountant._rdp, dtype=np.float64)
    orders = np.asarray(accountant._orders, dtype=np.float64)
    ratios = curve / orders
    return float(np.max(ratios[np.isfinite(ratios)]))


def accountant_rho(noise: StepNoise, steps: int) -> float:
    """Rho of ``steps`` DP-SGD steps, full batch or Poisson-subsampled.

    The RDP accountant's max over orders of RDP(a)/a for the (dominating)
    unsampled composition.
    """
    gaussian = dp_accounting.GaussianDpEvent(noise.multiplier)
    return _max_ratio(dp_accounting.SelfComposedDpEvent(gaussian, steps))


def charge(noise: StepNoise, steps: int) -> PrivacyCost:
    """The cost to record: the accountant's rho, rounded up.

    Up by a relative ``FLOAT_MARGIN`` (the library computes in floating point,
    through z = sqrt(sigma2) / delta, a few ulps from exact), then to the
    ledger's quantum; checked never to fall below the exact zCDP of the discrete
    Gaussian, T * delta^2 / (2 sigma2).
    """
    figure = Fraction(accountant_rho(noise, steps)) * (1 + FLOAT_MARGIN)
    cost = PrivacyCost.from_fraction("zcdp", figure)
    exact = steps * noise.gaussian.rho  # zCDP composes by adding rhos
    if cost.value < exact:  # float error below the exact cost: a bug, never charge less
        raise ConfigurationError("internal error: the accountant's figure is below the exact "
                                 "zCDP cost; this is a bug in dpsql")
    return cost


def calibrate(budget: PrivacyCost, delta: Fraction, steps: int,
              used_sigma2: Any) -> tuple[StepNoise, PrivacyCost]:
    """The least noise whose charged cost over ``steps`` fits in ``budget`` (zCDP).

    ``used_sigma2`` maps a requested variance to the (never smaller) one the
    sampler really uses; the variance grows until the charge fits.
    """
    if budget.kind != "zcdp":
        raise ConfigurationError("MODP's DP mode adds Gaussian noise and is accounted in zCDP; "
                                 "use a policy with accounting: zcdp")
    if budget.is_zero:
        raise ConfigurationError("no budget is left for DP-SGD; lower seed_share or raise the "
                                 "release's epsilon")
    # The exact start: ``steps`` Gaussian steps of sensitivity delta are one of squared
    # sensitivity steps * delta^2 (rhos add up).
    sigma2 = Fraction(used_sigma2(GaussianMechanism.calibrate_squared(steps * delta**2,
                                                                      budget).sigma2))
    for _ in range(64):
        noise = StepNoise(sigma2, delta)
        cost = charge(noise, steps)
        if cost <= budget:
            return noise, cost
        sigma2 = Fraction(used_sigma2(sigma2 * (1 + Fraction(1, 10**9))))
    raise ConfigurationError("internal error: could not fit the DP-SGD noise in the budget; "
                             "this is a bug in dpsql")
