"""The discrete Laplace mechanism: its privacy map and cost pinned at the boundary.

Its noise law is checked in ``test_additive.py``.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpsql.errors import ConfigurationError
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.privacy import PrivacyCost
from tests.mechanisms.boundary import less


def test_laplace_boundary():
    mech = LaplaceMechanism.calibrate(2, PrivacyCost.pure("0.5"))
    assert mech.scale == 4
    assert mech.check(2, PrivacyCost.pure("0.5"))
    assert not mech.check(2, PrivacyCost("pure", PrivacyCost.pure("0.5").units - 1))
    assert mech.cost() == PrivacyCost.pure("0.5")


def test_laplace_under_zcdp_costs_half_epsilon_squared():
    budget = PrivacyCost.zcdp("0.125")  # epsilon = 0.5
    mech = LaplaceMechanism.calibrate(1, budget)
    assert mech.cost("zcdp") <= budget
    assert mech.check(1, budget)


def test_an_infinite_budget_calibrates_to_no_noise():
    mech = LaplaceMechanism.calibrate(1, PrivacyCost.unbounded("pure"))
    assert mech.scale == 0
    assert mech.cost("pure").infinite
    assert mech.check(1, PrivacyCost.unbounded("pure"))
    assert not mech.check(1, PrivacyCost.pure(1000))
    assert np.array_equal(mech.release(np.array([3, 4])), [3, 4])


@pytest.mark.parametrize("epsilon", ["0.5", "0.1", "1.7", "0.123456789"])
def test_the_map_holds_at_epsilon_and_not_a_quantum_below(epsilon: str) -> None:
    """OpenDP's boundary: check(1, eps) holds; eps (1 - 1e-9) and one quantum less fail."""
    eps = PrivacyCost.pure(epsilon)
    mech = LaplaceMechanism.calibrate(1, eps)
    assert mech.scale == 1 / Fraction(epsilon)
    assert mech.check(1, eps)
    assert not mech.check(1, less(eps))
    assert not mech.check(1, PrivacyCost.pure(Fraction(epsilon) * (1 - Fraction(1, 10**9))))
    assert not mech.check(2, eps)  # two units apart: twice the loss


def test_cost_in_both_accountings_is_exact():
    mech = LaplaceMechanism(Fraction(3), Fraction(6))  # epsilon 1/2
    assert mech.cost("pure") == PrivacyCost.pure("0.5")
    assert mech.cost("zcdp") == PrivacyCost.zcdp("0.125")  # epsilon^2 / 2
    for kind in ("pure", "zcdp"):
        cost = mech.cost(kind)
        assert mech.check(3, cost)
        assert not mech.check(3, less(cost))


def test_a_zcdp_calibration_fits_its_rho_at_the_boundary():
    rho = PrivacyCost.zcdp("0.02")
    mech = LaplaceMechanism.calibrate(2, rho)
    assert mech.check(2, rho)
    cost = mech.cost("zcdp")
    assert cost <= rho
    assert mech.check(2, cost)
    assert not mech.check(2, less(cost))


@pytest.mark.parametrize("kind", ["pure", "zcdp"])
def test_a_scale_too_small_by_0_7_fails_the_map(kind: str) -> None:
    share = PrivacyCost.pure("0.5") if kind == "pure" else PrivacyCost.zcdp("0.125")
    mech = LaplaceMechanism.calibrate(1, share)
    assert mech.check(1, share)
    assert not LaplaceMechanism(mech.sensitivity, mech.scale * Fraction(7, 10)).check(1, share)


def test_the_scale_used_rounds_up_and_is_priced_as_used():
    share = PrivacyCost.pure("0.123456789123456789")
    mech = LaplaceMechanism.calibrate(1, share)
    used = mech.used()
    assert used.scale > mech.scale  # not representable: rounded up, never down
    assert used.check(1, share)
    assert used.cost("pure") < share


def test_a_zero_budget_is_refused():
    with pytest.raises(ConfigurationError):
        LaplaceMechanism.calibrate(1, PrivacyCost.zero("pure"))

