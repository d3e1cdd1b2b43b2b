"""Key selection's threshold: its map pinned at the boundary in rho and in delta."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import pytest

from dpsql.errors import ConfigurationError, InternalError
from dpsql.mechanisms.gaussian import GaussianMechanism
from dpsql.mechanisms.threshold import KeyThreshold
from dpsql.privacy import PrivacyCost
from tests.mechanisms.boundary import less

RHO = PrivacyCost.zcdp("0.5")


@pytest.mark.parametrize(("max_rows", "delta"), [(1, 1e-6), (3, 1e-9), (10, 0.01)])
def test_the_map_holds_at_rho_and_delta_and_not_below_either(max_rows: int, delta: float) -> None:
    selection = KeyThreshold.calibrate(max_rows, RHO, delta)
    assert selection.check(max_rows, RHO)
    assert not selection.check(max_rows, less(RHO))  # rho: one quantum less
    tight = replace(selection, delta=selection.leak())
    assert tight.check(max_rows, RHO)  # delta: exactly the leak bound holds ...
    assert not replace(tight, delta=math.nextafter(tight.delta, 0)).check(max_rows, RHO)
    lower = replace(selection, tau=selection.tau - 1)  # ... and tau is the least that fits
    assert lower.leak() > delta
    assert not lower.check(max_rows, RHO)


def test_tau_is_max_rows_plus_the_gaussian_tail() -> None:
    selection = KeyThreshold.calibrate(1, PrivacyCost.zcdp("0.125"), 1e-6)  # sigma^2 = 4
    assert selection.counts.sigma2 == 4
    assert selection.tau == 1 + math.ceil(math.sqrt(2 * 4 * math.log(1e6)) * (1 + 1e-9))


def test_cost_is_the_counts_rho_and_pure_accounting_is_refused() -> None:
    selection = KeyThreshold.calibrate(2, RHO, 1e-6)
    assert selection.cost("zcdp") == selection.counts.cost("zcdp") <= RHO
    with pytest.raises(ConfigurationError):
        selection.cost("pure")
    assert not selection.check(2, PrivacyCost.pure(100))
    with pytest.raises(ConfigurationError):
        KeyThreshold.calibrate(2, PrivacyCost.pure(1), 1e-6)


def test_a_sigma_too_small_by_0_7_fails_the_map() -> None:
    selection = KeyThreshold.calibrate(1, RHO, 1e-6)
    counts = selection.counts
    wrong = replace(selection, counts=GaussianMechanism(counts.sensitivity2,
                                                        counts.sigma2 * Fraction(49, 100)))
    assert not wrong.check(1, RHO)  # the counts' rho
    noisier = replace(selection, counts=GaussianMechanism(counts.sensitivity2,
                                                          counts.sigma2 / Fraction(49, 100)))
    assert not noisier.check(1, noisier.cost())  # the same tau leaks more than delta


@pytest.mark.parametrize("factor", [Fraction(7, 10), Fraction(13, 10)])
def test_a_tau_calibrated_to_another_sigma_is_caught(factor: Fraction) -> None:
    """tau is tied to the counts' sigma: one from a sigma 0.7x (or 1.3x) fails a map."""
    selection = KeyThreshold.calibrate(2, RHO, 1e-6)
    other = KeyThreshold.over(GaussianMechanism(selection.counts.sensitivity2,
                                                selection.counts.sigma2 * factor**2), 2, 1e-6)
    mixed = replace(selection, tau=other.tau)
    assert other.tau != selection.tau
    assert mixed.check(2, RHO) == (other.tau > selection.tau)


def test_noiseless_counts_or_no_delta_are_a_bug() -> None:
    with pytest.raises(InternalError):
        KeyThreshold.over(GaussianMechanism(Fraction(1), Fraction(0)), 1, 1e-6)
    with pytest.raises(InternalError):
        KeyThreshold.calibrate(1, RHO, 0.0)
