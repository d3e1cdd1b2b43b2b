"""Report noisy max with discrete Laplace noise: the index of the largest noisy score.

Privacy: add independent discrete Laplace noise of scale ``b`` to integer
scores that one privacy unit moves by at most ``Delta`` each (in any direction,
not necessarily monotone) and report the index of the largest (ties to the
smallest index): ``(2 Delta / b)``-DP. The argument of Dwork & Roth 2014, Claim
3.9, for non-monotone scores holds for any integer noise whose tail ratio under
an integer shift ``s`` is at least ``e^{-s/b}``, which the discrete Laplace
satisfies. It is therefore the discrete Laplace mechanism's cost at sensitivity
``2 Delta`` (:class:`~dpsql.mechanisms.laplace.LaplaceMechanism` calibrates and
prices it), charged to a zCDP budget as ``(2 Delta / b)^2 / 2`` (Bun & Steinke
2016, Prop. 1.4). Used by SDS for its DP percentile of records' tuple counts
(:mod:`dpsql.synth.sds.aggregates`, step 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql import noise
from dpsql.errors import ConfigurationError
from dpsql.mechanisms.base import positive, verified
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.privacy import Kind, Number, PrivacyCost, to_fraction


@dataclass(frozen=True)
class ReportNoisyMax:
    """The largest of integer scores of ``sensitivity`` plus discrete Laplace noise of ``scale``.

    Privacy: (2 sensitivity / scale)-DP under add/remove of one privacy unit (module docstring).
    """

    sensitivity: Fraction
    scale: Fraction
    name = "report_noisy_max"

    @property
    def _laplace(self) -> LaplaceMechanism:
        """The Laplace mechanism with the same loss: sensitivity doubled."""
        return LaplaceMechanism(2 * self.sensitivity, self.scale)

    @classmethod
    def calibrate(cls, sensitivity: Number, cost: PrivacyCost) -> ReportNoisyMax:
        """The smallest scale whose loss fits in ``cost`` (0 for an infinite cost)."""
        sens = positive(sensitivity, "sensitivity")
        mechanism = cls(sens, LaplaceMechanism.calibrate(2 * sens, cost).scale)
        return verified(mechanism, mechanism.check(sens, cost))

    def used(self) -> ReportNoisyMax:
        """This mechanism with the scale the sampler really draws with (never smaller)."""
        return ReportNoisyMax(self.sensitivity, self._laplace.used().scale)

    def cost(self, kind: Kind = "zcdp") -> PrivacyCost:
        """2 sensitivity / scale (pure), or its square over 2 (zCDP), rounded up."""
        return self._laplace.cost(kind)

    def check(self, d_in: Number, d_out: PrivacyCost) -> bool:
        """Whether scores moving by at most ``d_in`` lose at most ``d_out``."""
        return self._laplace.check(2 * to_fraction(d_in, "d_in"), d_out)

    def select(self, scores: np.ndarray) -> int:
        """The index of the largest noisy score (ties to the smallest); the best without noise."""
        q = np.asarray(scores)
        if q.ndim != 1 or q.size == 0 or q.dtype.kind not in "iu":
            raise ConfigurationError("report noisy max needs a non-empty list of integer scores")
        if self.scale == 0:
            return int(np.argmax(q))
        return int(np.argmax(q + noise.discrete_laplace(self.scale, len(q))))
