"""The exponential mechanism, sampled exactly from the OS CSPRNG.

Privacy: choosing ``i`` with probability proportional to ``exp(epsilon q_i /
(2 sensitivity))`` is epsilon-DP when each score changes by at most
``sensitivity`` between neighbours (McSherry & Talwar 2007). Its privacy loss
lies in an interval of width epsilon (it is epsilon-bounded-range), so it is
also (epsilon^2 / 8)-zCDP (Cesar & Rogers 2021, Lemma 3.2; Durfee & Rogers
2019), four times cheaper than the epsilon^2 / 2 that pure DP alone implies.

Sampling is exact: scores are integers and ``epsilon / (2 sensitivity)`` a
rational ``a / b``, so the mechanism is rejection sampling with a uniform
proposal and acceptance probability ``exp(-(q_max - q_i) a / b)``, drawn with the
exact Bernoulli(exp(-gamma)) sampler of Canonne, Kamath & Steinke (2020) behind
:mod:`dpsql.noise`. No floating-point value touches the choice. The running
time depends on the scores (an accepted proposal ends the loop); the output
distribution does not depend on anything but them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql import _exact
from dpsql.errors import ConfigurationError
from dpsql.mechanisms.base import positive, verified
from dpsql.privacy import Kind, Number, PrivacyCost, to_fraction

_RATE_BITS = 40  # epsilon / (2 sensitivity) is rounded down to a multiple of 2**-40


@dataclass(frozen=True)
class ExponentialMechanism:
    """Select one of several candidates with integer scores of bounded ``sensitivity``.

    Privacy: epsilon-DP, and (epsilon^2 / 8)-zCDP, when one privacy unit moves
    every score by at most ``sensitivity`` (module docstring). Used by SQL
    quantiles (:mod:`dpsql.query.quantile`) and by the synthesizers' selections
    (AIM's and MST's marginals, NAPSU-MQ's MST rounds).
    """

    sensitivity: Fraction
    epsilon: Fraction
    name = "exponential"

    @classmethod
    def calibrate(cls, sensitivity: Number, cost: PrivacyCost) -> ExponentialMechanism:
        """The largest epsilon (on a 2**-40 grid of the rate) whose cost fits in ``cost``."""
        sens = positive(sensitivity, "sensitivity")
        if cost.infinite or cost.is_zero:
            raise ConfigurationError("the exponential mechanism needs a finite, positive budget")
        target = math.sqrt(8 * cost.value) if cost.kind == "zcdp" else float(cost.value)
        rate = Fraction(math.floor(target / float(2 * sens) * 2**_RATE_BITS), 2**_RATE_BITS)
        mechanism = cls(sens, 2 * sens * rate)
        while mechanism.epsilon > 0 and mechanism.cost(cost.kind) > cost:
            rate -= Fraction(1, 2**_RATE_BITS)
            mechanism = cls(sens, 2 * sens * rate)
        if mechanism.epsilon <= 0:
            raise ConfigurationError("the selection budget is too small to choose anything")
        return verified(mechanism, mechanism.check(sens, cost))

    @property
    def rate(self) -> Fraction:
        """Epsilon / (2 sensitivity): the weight of one unit of score in the log-probability."""
        return self.epsilon / (2 * self.sensitivity)

    def cost(self, kind: Kind = "zcdp") -> PrivacyCost:
        """Epsilon (pure) or epsilon^2 / 8 (zCDP, bounded range), rounded up."""
        if kind == "pure":
            return PrivacyCost.from_fraction("pure", self.epsilon)
        return PrivacyCost.from_fraction("zcdp", self.epsilon**2 / 8)

    def check(self, d_in: Number, d_out: PrivacyCost) -> bool:
        """Whether scores moving by at most ``d_in`` lose at most ``d_out``."""
        if d_out.infinite:
            return True
        epsilon = self.epsilon * to_fraction(d_in, "d_in") / self.sensitivity
        if d_out.kind == "pure":
            return epsilon <= d_out.value
        return epsilon**2 / 8 <= d_out.value

    def select(self, scores: Sequence[int] | np.ndarray) -> int:
        """Index of the chosen candidate (higher scores are likelier)."""
        q = np.asarray(scores)
        if q.ndim != 1 or q.size == 0:
            raise ConfigurationError("the exponential mechanism needs a non-empty list of scores")
        if q.dtype.kind not in "iu":
            raise ConfigurationError("exponential-mechanism scores must be integers")
        rate = self.rate
        # Gaps beyond ``cap`` (probability below exp(-2**20)) are lowered to it, so the
        # sampler's integers never overflow: max(q, max(q) - cap) keeps the sensitivity of
        # q, so this is the same mechanism on other scores, and no failure depends on data.
        cap = max(1, 2**20 * rate.denominator // rate.numerator)
        gaps = np.minimum(q.max() - q, cap).astype(np.int64)
        while True:
            proposals = _exact.uniform_below(q.size, q.size)
            accepted = _exact.bernoulli_exp(gaps[proposals] * rate.numerator, rate.denominator)
            hits = np.flatnonzero(accepted)
            if hits.size:
                return int(proposals[hits[0]])
