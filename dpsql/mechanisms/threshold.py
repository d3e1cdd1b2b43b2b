"""Key selection's threshold: a key is released when its discrete-Gaussian noisy count reaches tau.

Used by SQL ``GROUP BY`` over a column whose values the policy does not list
(:mod:`dpsql.query.selection`): every key present in the bounded source gets a
noisy row count, and only the keys whose count is at least ``tau`` are shown.

Privacy: a unit adds at most ``m`` rows to the bounded source (``m = max_rows``,
the mechanism's ``sensitivity`` in rows), so it changes at most ``m`` keys'
counts, by ``m`` in all (L1 and L2 sensitivity ``m``, as for any count). On keys
present with or without the unit the counts are the discrete Gaussian
mechanism, ``rho``-zCDP (Canonne, Kamath & Steinke 2020). A key only the unit
holds has a count ``c <= m`` and is released with probability
``P(Z >= tau - c) <= exp(-(tau - m)**2 / (2 sigma**2))`` (the discrete
Gaussian's sub-Gaussian tail, ibid. Cor. 9); over its at most ``m`` such keys,
with ``tau = m + ceil(sigma * sqrt(2 ln(m / delta)))``, the chance that any is
released is at most ``delta``. The selection is therefore ``delta``-approximate
``rho``-zCDP (Bun & Steinke 2016, Def. 8; Korolova et al. 2009 and Wilson et
al. 2020 use the same thresholded-count argument with Laplace noise). Its cost
is the counts' rho; its ``delta`` is part of what it promises, and
:meth:`KeyThreshold.check` holds only when the leak bound is within it. Pure
accounting has no delta: the mechanism cannot be charged there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dpsql.errors import InternalError
from dpsql.mechanisms.base import positive, verified
from dpsql.mechanisms.gaussian import GaussianMechanism
from dpsql.privacy import Kind, Number, PrivacyCost, to_fraction

#: Relative round-up of the float tail bound (its float error is a few ulps).
LEAK_MARGIN = 1e-12


def leak_bound(sigma2: Fraction, rows: Number, tau: int) -> float:
    """The most probability with which any key held by ``rows`` rows alone is released.

    At most ``rows`` such keys, each with a count of at most ``rows``: the sub-Gaussian
    tail at ``tau - rows``, times ``rows``, rounded up.
    """
    held = float(to_fraction(rows, "rows"))
    gap = tau - held
    if gap <= 0:
        return 1.0
    return min(1.0, held * math.exp(-gap * gap / (2 * float(sigma2))) * (1 + LEAK_MARGIN))


@dataclass(frozen=True)
class KeyThreshold:
    """Release the keys whose ``counts``-noised row count is at least ``tau``.

    ``sensitivity``: rows one privacy unit adds to the bounded source (``max_rows``);
    ``delta``: the probability the selection promises to leak a unit's own key at most.
    Privacy: delta-approximate rho-zCDP, rho the counts' (module docstring).
    """

    counts: GaussianMechanism
    sensitivity: int
    tau: int
    delta: float
    name = "partition_selection"

    @classmethod
    def over(cls, counts: GaussianMechanism, sensitivity: int, delta: float) -> KeyThreshold:
        """The least threshold whose leak bound is within ``delta``, on counts already noised."""
        if counts.sigma2 == 0 or not 0 < delta < 1:
            raise InternalError("partition selection needs noisy counts and a delta in (0, 1); "
                                "this is a bug in dpsql")
        margin = math.sqrt(2 * float(counts.sigma2) * math.log(sensitivity / delta))
        tau = sensitivity + math.ceil(margin * (1 + 1e-9))  # rounded against the analyst
        mechanism = cls(counts, sensitivity, tau, delta)
        return verified(mechanism, mechanism.leak() <= delta)

    @classmethod
    def calibrate(cls, sensitivity: int, cost: PrivacyCost, delta: float) -> KeyThreshold:
        """Counts calibrated to ``cost`` (as sampled), and their threshold for ``delta``."""
        positive(sensitivity, "sensitivity")
        counts = GaussianMechanism.calibrate(sensitivity, cost).used()
        mechanism = cls.over(counts, sensitivity, delta)
        return verified(mechanism, mechanism.check(sensitivity, cost))

    def leak(self, d_in: Number | None = None) -> float:
        """The leak bound for neighbours ``d_in`` rows apart (default: one privacy unit)."""
        return leak_bound(self.counts.sigma2, self.sensitivity if d_in is None else d_in,
                          self.tau)

    def cost(self, kind: Kind = "zcdp") -> PrivacyCost:
        """The counts' rho, rounded up (plus ``delta``, which no PrivacyCost holds)."""
        return self.counts.cost(kind)

    def check(self, d_in: Number, d_out: PrivacyCost) -> bool:
        """Whether neighbours ``d_in`` rows apart lose at most ``d_out`` with at most ``delta``."""
        return self.counts.check(d_in, d_out) and self.leak(d_in) <= self.delta
