"""DP-SGD accounting: the charge is the dp-accounting figure, exact, and fits the budget."""

from __future__ import annotations

import math
from fractions import Fraction

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.errors import ConfigurationError
from dpsql.privacy import PrivacyCost
from dpsql.synth.modp.accounting import (
    FLOAT_MARGIN,
    StepNoise,
    accountant_rho,
    calibrate,
    charge,
)


def _library_rho(multiplier: float, steps: int, sampling_rate: float = 1.0,
                 orders: list[float] | None = None) -> float:
    """max over orders of RDP/order, straight from dp-accounting."""
    event: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(multiplier)
    if sampling_rate < 1:
        event = dp_accounting.PoissonSampledDpEvent(sampling_rate, event)
    accountant = rdp.RdpAccountant(orders=orders)
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return float(np.max(np.asarray(accountant._rdp) / np.asarray(accountant._orders)))


def test_full_batch_rho_is_exactly_steps_over_two_z_squared() -> None:
    noise = StepNoise(sigma2=Fraction(400), delta=Fraction(2))  # z = 10
    assert noise.multiplier == 10.0
    assert accountant_rho(noise, 50) == pytest.approx(50 / 200, rel=1e-12)
    assert accountant_rho(noise, 50) == pytest.approx(_library_rho(10.0, 50), rel=1e-15)


def test_charge_is_the_accountant_figure_rounded_up() -> None:
    noise = StepNoise(sigma2=Fraction(12345, 7), delta=Fraction(3))
    cost = charge(noise, 77)
    figure = _library_rho(noise.multiplier, 77)
    assert cost == PrivacyCost.from_fraction("zcdp", Fraction(figure) * (1 + FLOAT_MARGIN))
    assert cost.value >= 77 * noise.delta**2 / (2 * noise.sigma2)  # never below the exact cost
    assert cost.value - Fraction(figure) < Fraction(figure) * Fraction(2, 10**12)


@pytest.mark.parametrize("rate", [0.01, 0.1, 0.5])
@pytest.mark.parametrize("multiplier", [0.8, 2.0, 10.0])
def test_poisson_subsampling_is_charged_the_dominating_full_batch_figure(
        rate: float, multiplier: float) -> None:
    # the library's subsampled curve stays below the charge at every (exact, integer) order,
    # and approaches it: zCDP gets no amplification from subsampling
    orders = [2, 3, 4, 8, 16, 32, 64, 128, 256, 1024]
    sampled = _library_rho(multiplier, 40, rate, orders)
    full = accountant_rho(StepNoise(Fraction(multiplier) ** 2, Fraction(1)), 40)
    assert sampled <= full * (1 + 1e-12)
    assert full == pytest.approx(40 / (2 * multiplier**2), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(rho=st.fractions(min_value=Fraction(1, 10**6), max_value=Fraction(50)),
       steps=st.integers(1, 2000), delta=st.integers(1, 2**24))
def test_calibrated_cost_never_exceeds_the_budget_and_wastes_little(
        rho: Fraction, steps: int, delta: int) -> None:
    budget = PrivacyCost.from_fraction("zcdp", rho, round_up=False)
    if budget.is_zero:
        return
    noise, cost = calibrate(budget, Fraction(delta), steps, lambda s2: Fraction(s2))
    assert cost <= budget
    assert cost == charge(noise, steps)
    assert cost.value >= budget.value * (1 - Fraction(1, 10**6))
    assert cost.value >= steps * noise.delta**2 / (2 * noise.sigma2)


def test_calibrate_uses_the_samplers_rounded_variance() -> None:
    budget = PrivacyCost.zcdp("0.01")
    rounded = []

    def coarser(sigma2: Fraction) -> Fraction:
        up = Fraction(math.ceil(sigma2 * 8), 8)  # a sampler that only does multiples of 1/8
        rounded.append(up)
        return up

    noise, cost = calibrate(budget, Fraction(1000), 100, coarser)
    assert noise.sigma2 == rounded[-1]
    assert noise.sigma2 * 8 == int(noise.sigma2 * 8)
    assert cost <= budget


def test_pure_budget_and_zero_budget_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="zCDP"):
        calibrate(PrivacyCost.pure(1), Fraction(1), 10, Fraction)
    with pytest.raises(ConfigurationError, match="no budget"):
        calibrate(PrivacyCost.zero("zcdp"), Fraction(1), 10, Fraction)
