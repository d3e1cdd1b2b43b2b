"""The discrete Gaussian mechanism: its privacy map and cost pinned at the boundary.

Its noise law is checked in ``test_additive.py``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpsql.errors import ConfigurationError
from dpsql.mechanisms.gaussian import GaussianMechanism
from dpsql.privacy import PrivacyCost
from tests.mechanisms.boundary import less


def test_gaussian_boundary():
    rho = PrivacyCost.zcdp("0.02")
    mech = GaussianMechanism.calibrate(3, rho)
    assert mech.sigma2 == Fraction(9) / (2 * Fraction("0.02"))
    assert mech.check(3, rho)
    assert not mech.check(3, PrivacyCost("zcdp", rho.units - 1))
    assert mech.cost() == rho


def test_gaussian_needs_zcdp():
    with pytest.raises(ConfigurationError):
        GaussianMechanism.calibrate(1, PrivacyCost.pure(1))



@pytest.mark.parametrize("rho", ["0.5", "0.02", "3", "0.000123456789"])
def test_the_map_holds_at_rho_and_not_a_quantum_below(rho: str) -> None:
    """OpenDP's boundary: check(1, rho) holds; rho (1 - 1e-9) and one quantum less fail."""
    cost = PrivacyCost.zcdp(rho)
    mech = GaussianMechanism.calibrate(1, cost)
    assert mech.check(1, cost)
    assert not mech.check(1, less(cost))
    assert not mech.check(1, PrivacyCost.zcdp(Fraction(rho) * (1 - Fraction(1, 10**9))))
    assert not mech.check(2, cost)  # two units apart: four times the rho


def test_cost_in_both_accountings():
    mech = GaussianMechanism(Fraction(4), Fraction(16))  # sensitivity 2, sigma 4: rho 1/8
    assert mech.sensitivity == 2
    assert mech.cost("zcdp") == PrivacyCost.zcdp("0.125")
    assert mech.check(2, mech.cost("zcdp"))
    assert not mech.check(2, less(mech.cost("zcdp")))
    with pytest.raises(ConfigurationError, match="pure"):
        mech.cost("pure")
    assert not mech.check(2, PrivacyCost.pure(1000))  # no epsilon bounds it


def test_a_squared_sensitivity_is_exact():
    """SDS's k-tuple counts: sensitivity m sqrt(s), kept squared so the cost is exact."""
    rho = PrivacyCost.zcdp("0.01")
    mech = GaussianMechanism.calibrate_squared(3, rho)  # sensitivity sqrt(3)
    assert mech.sigma2 == Fraction(3) / (2 * Fraction("0.01"))
    assert mech.cost() == rho
    assert mech.check_squared(3, rho)
    assert not mech.check_squared(3, less(rho))
    assert mech.sensitivity >= math.sqrt(3)  # shown rounded up


def test_a_sigma_too_small_by_0_7_fails_the_map():
    rho = PrivacyCost.zcdp("0.125")
    mech = GaussianMechanism.calibrate(1, rho)
    assert not GaussianMechanism(mech.sensitivity2, mech.sigma2 * Fraction(49, 100)).check(1, rho)


def test_the_sigma_used_rounds_up_and_is_priced_as_used():
    rho = PrivacyCost.zcdp("0.000123456789123456789")
    mech = GaussianMechanism.calibrate(1, rho)
    used = mech.used()
    assert used.sigma2 > mech.sigma2
    assert used.check(1, rho)
    assert used.cost() < rho


def test_an_infinite_budget_adds_no_noise_and_a_zero_one_is_refused():
    mech = GaussianMechanism.calibrate(1, PrivacyCost.unbounded("zcdp"))
    assert mech.sigma2 == 0
    assert mech.cost().infinite
    assert np.array_equal(mech.release(np.array([3, 4])), [3, 4])
    with pytest.raises(ConfigurationError):
        GaussianMechanism.calibrate(1, PrivacyCost.zero("zcdp"))

