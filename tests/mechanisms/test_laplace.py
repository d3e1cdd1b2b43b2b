"""The discrete Laplace mechanism pinned at its boundary (moved from tests/test_privacy.py)."""

from __future__ import annotations

from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.privacy import PrivacyCost


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
    assert LaplaceMechanism.calibrate(1, PrivacyCost.unbounded("pure")).scale == 0
