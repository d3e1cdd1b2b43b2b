"""Report noisy max (SDS's DP percentile): its map and cost at the boundary, and its choices."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpsql.mechanisms.noisy_max import ReportNoisyMax
from dpsql.privacy import PrivacyCost
from tests.mechanisms.boundary import less

FALSE_POSITIVE_RATE = 1e-6


@pytest.mark.parametrize("cost", [PrivacyCost.pure("0.5"), PrivacyCost.zcdp("0.125")],
                         ids=["pure", "zcdp"])
def test_the_map_holds_at_the_budget_and_not_a_quantum_below(cost: PrivacyCost) -> None:
    """Scores of sensitivity 3 at epsilon 1/2 need scale 2 * 3 / (1/2) = 12."""
    mechanism = ReportNoisyMax.calibrate(3, cost)
    assert mechanism.scale == 12
    assert mechanism.cost(cost.kind) == cost
    assert mechanism.check(3, cost)
    assert not mechanism.check(3, less(cost))
    assert not mechanism.check(6, cost)


def test_cost_in_both_accountings_is_twice_the_laplace() -> None:
    mechanism = ReportNoisyMax(Fraction(1), Fraction(4))  # 2 * 1 / 4
    assert mechanism.cost("pure") == PrivacyCost.pure("0.5")
    assert mechanism.cost("zcdp") == PrivacyCost.zcdp("0.125")


def test_a_scale_too_small_by_0_7_fails_the_map() -> None:
    cost = PrivacyCost.pure("0.5")
    mechanism = ReportNoisyMax.calibrate(1, cost)
    assert not ReportNoisyMax(mechanism.sensitivity, mechanism.scale * Fraction(7, 10)).check(
        1, cost)


def test_without_noise_it_is_the_argmax() -> None:
    mechanism = ReportNoisyMax.calibrate(1, PrivacyCost.unbounded("zcdp"))
    assert mechanism.scale == 0
    assert mechanism.select(np.array([1, 5, 5, 2])) == 1  # ties to the smallest index


def test_choices_follow_the_noisy_max_law() -> None:
    """Two scores 4 apart, scale 4: P(second wins) = P(Z2 - Z1 > 4), from the discrete Laplace.

    A binomial test at FALSE_POSITIVE_RATE; the scale 0.7x or 1.3x changes that
    probability by far more than the test's resolution at 20,000 draws.
    """
    mechanism = ReportNoisyMax(Fraction(1), Fraction(4))
    scores = np.array([4, 0], dtype=np.int64)
    draws = 20_000
    wins = sum(mechanism.select(scores) for _ in range(draws))

    def p_second(scale: float) -> float:
        z = np.arange(-400, 401)
        pmf = np.exp(-np.abs(z) / scale)
        pmf /= pmf.sum()
        diff = np.convolve(pmf, pmf[::-1])  # Z2 - Z1 on -800..800
        return float(diff[np.arange(-800, 801) > 4].sum())

    assert stats.binomtest(wins, draws, p_second(4.0)).pvalue > FALSE_POSITIVE_RATE
    for wrong in (0.7, 1.3):
        assert stats.binomtest(wins, draws, p_second(4.0 * wrong)).pvalue < FALSE_POSITIVE_RATE
