"""The exact exponential mechanism: cost at the boundary, and its output law."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpsql.errors import ConfigurationError
from dpsql.mechanisms.exponential import ExponentialMechanism
from dpsql.privacy import PrivacyCost

FALSE_POSITIVE_RATE = 1e-6  # per goodness-of-fit check


@pytest.mark.parametrize("rho", ["0.001", "0.05", "1", "3.7"])
def test_calibrated_cost_fits_and_is_tight(rho: str) -> None:
    budget = PrivacyCost.zcdp(rho)
    mechanism = ExponentialMechanism.calibrate(1, budget)
    assert mechanism.cost("zcdp") <= budget
    assert mechanism.check(1, budget)
    # Tight: the grid rounding leaves less than one part in a million unused.
    assert not mechanism.check(1, PrivacyCost.zcdp(Fraction(rho) * (1 - Fraction(1, 10**6))))
    # Bounded range: epsilon^2 / 8, four times cheaper than pure DP's epsilon^2 / 2.
    assert mechanism.epsilon**2 / 8 <= Fraction(rho)


def test_pure_cost_is_epsilon_and_sensitivity_scales() -> None:
    mechanism = ExponentialMechanism.calibrate(3, PrivacyCost.pure("0.5"))
    assert mechanism.cost("pure") <= PrivacyCost.pure("0.5")
    assert mechanism.check(3, PrivacyCost.pure("0.5"))
    assert not mechanism.check(3, PrivacyCost.pure("0.4999"))
    assert mechanism.check(1, PrivacyCost.pure("0.17"))  # d_in 1 of sensitivity 3: a third
    assert mechanism.rate == mechanism.epsilon / 6


def test_zero_or_infinite_budget_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        ExponentialMechanism.calibrate(1, PrivacyCost.zero("zcdp"))
    with pytest.raises(ConfigurationError):
        ExponentialMechanism(Fraction(1), Fraction(1)).select(np.array([0.5, 1.0]))


def law(scores: np.ndarray, rate: float) -> np.ndarray:
    logits = rate * scores
    p = np.exp(logits - logits.max())
    return p / p.sum()


@pytest.mark.usefixtures("seeded_entropy")
def test_selection_follows_the_exponential_law_and_rejects_wrong_rates() -> None:
    scores = np.array([0, 1, 2, 3, 5, 5], dtype=np.int64)
    mechanism = ExponentialMechanism(Fraction(1), Fraction(1))  # rate 1/2 per score unit
    draws = 30_000
    counts = np.bincount([mechanism.select(scores) for _ in range(draws)], minlength=scores.size)
    critical = stats.chi2.ppf(1 - FALSE_POSITIVE_RATE, scores.size - 1)
    right = stats.chisquare(counts, draws * law(scores, 0.5)).statistic
    assert right < critical
    for wrong in (0.35, 0.65):  # the rate scaled by 0.7 and 1.3 must be rejected
        assert stats.chisquare(counts, draws * law(scores, wrong)).statistic > critical


@pytest.mark.parametrize("cost", [PrivacyCost.pure("0.5"), PrivacyCost.zcdp(Fraction(1, 32))],
                         ids=["pure", "zcdp"])
def test_the_map_holds_at_the_budget_and_not_a_quantum_below(cost: PrivacyCost) -> None:
    """Epsilon 1/2 (or rho 1/32 = (1/2)^2 / 8) lies on the rate grid: the boundary is exact."""
    mechanism = ExponentialMechanism.calibrate(2, cost)
    assert mechanism.epsilon == Fraction(1, 2)
    assert mechanism.cost(cost.kind) == cost
    assert mechanism.check(2, cost)
    assert not mechanism.check(2, PrivacyCost(cost.kind, cost.units - 1))
    assert not mechanism.check(4, cost)  # scores twice as far apart


def test_cost_in_both_accountings() -> None:
    mechanism = ExponentialMechanism(Fraction(1), Fraction(1, 2))
    assert mechanism.cost("pure") == PrivacyCost.pure("0.5")
    assert mechanism.cost("zcdp") == PrivacyCost.zcdp(Fraction(1, 32))  # bounded range


@pytest.mark.parametrize("cost", [PrivacyCost.pure("0.5"), PrivacyCost.zcdp("0.01")],
                         ids=["pure", "zcdp"])
def test_a_scale_too_small_by_0_7_fails_the_map(cost: PrivacyCost) -> None:
    """The scale 2 sensitivity / epsilon times 0.7 is epsilon / 0.7: more than the budget."""
    mechanism = ExponentialMechanism.calibrate(1, cost)
    wrong = ExponentialMechanism(mechanism.sensitivity, mechanism.epsilon / Fraction(7, 10))
    assert not wrong.check(1, cost)
