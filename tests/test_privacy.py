"""Exact accounting: composition, conversions, calibration, pinned at their boundaries."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from dpsql.errors import ConfigurationError
from dpsql.privacy import (
    QUANTUM,
    PrivacyCost,
    budget_cost,
    epsilon_from_rho,
    figure,
    rho_from_epsilon_delta,
    zcdp_epsilon,
)

ONE_QUANTUM_PURE = PrivacyCost("pure", 1)


def test_decimal_inputs_are_exact():
    assert PrivacyCost.pure(0.1).value == Fraction(1, 10)
    assert PrivacyCost.pure("0.1") == PrivacyCost.pure(Fraction(1, 10))
    total = PrivacyCost.zero("pure")
    for _ in range(10):
        total = total + PrivacyCost.pure(0.1)
    assert total == PrivacyCost.pure(1)


def test_charges_round_up_and_budgets_round_down():
    third = Fraction(1, 3)
    up = PrivacyCost.from_fraction("pure", third)
    down = PrivacyCost.from_fraction("pure", third, round_up=False)
    assert up.value > third > down.value
    assert up.units - down.units == 1
    parts = PrivacyCost.pure(1).split([1, 1, 1])
    assert sum(p.units for p in parts) <= PrivacyCost.pure(1).units


@pytest.mark.parametrize(("value", "up", "down", "nearest"), [
    pytest.param(Fraction(1, 3), "0.3334", "0.3333", "0.3333", id="third"),
    pytest.param(Fraction(2, 3), "0.6667", "0.6666", "0.6667", id="two_thirds"),
    pytest.param(Fraction(123456, 10), "12350", "12340", "12350", id="large"),
    pytest.param(Fraction(1, 2), "0.5", "0.5", "0.5", id="exact"),
    pytest.param(Fraction(0), "0", "0", "0", id="zero"),
    # a float from the conversion, a hair below 1: read at 10 figures first, so not 0.9999
    pytest.param(0.9999999999996, "1", "1", "1", id="float_noise"),
    pytest.param(0.99995, "1", "0.9999", "1", id="float_real_digits"),
])
def test_figures_round_to_four_significant_in_the_direction_asked(value, up, down, nearest):
    assert (figure(value, "up"), figure(value, "down"), figure(value, "nearest")) == \
        (up, down, nearest)


def test_displayed_budgets_never_show_more_left_nor_less_spent_than_is_true():
    rng = random.Random(5)
    for _ in range(300):
        value = Fraction(rng.randrange(1, 10**20), 10**rng.randrange(10, 25))
        assert Fraction(figure(value, "down")) <= value <= Fraction(figure(value, "up"))


def test_a_zcdp_budget_of_epsilon_one_shows_epsilon_one():
    budget = budget_cost("zcdp", epsilon=1, delta=1e-6)
    assert budget.describe(1e-6, "down") == "rho=0.02435 (epsilon=1 at delta=1e-06)"
    assert budget.describe(1e-6, "nearest") == "rho=0.02436 (epsilon=1 at delta=1e-06)"
    assert PrivacyCost.pure(1).describe(None, "down") == "epsilon=1"


@pytest.mark.parametrize("bad", [0.0 - 1, float("nan"), float("inf") * -1, "abc", True])
def test_invalid_costs_raise(bad):
    with pytest.raises(ConfigurationError):
        PrivacyCost.pure(bad)


@pytest.mark.parametrize("eps", [0, -1, float("nan"), float("inf")])
def test_budget_cost_rejects_bad_epsilon(eps):
    with pytest.raises(ConfigurationError):
        budget_cost("pure", epsilon=eps)


@pytest.mark.parametrize("delta", [-0.1, 1.0, 2, float("nan")])
def test_budget_cost_rejects_bad_delta(delta):
    with pytest.raises(ConfigurationError):
        budget_cost("zcdp", epsilon=1, delta=delta)


def test_mixing_kinds_is_refused():
    with pytest.raises(ConfigurationError):
        PrivacyCost.pure(1) + PrivacyCost.zcdp(1)
    with pytest.raises(ConfigurationError):
        PrivacyCost.zcdp(1).to("pure")


def test_pure_to_zcdp_is_half_epsilon_squared():
    assert PrivacyCost.pure("0.3").to_zcdp() == PrivacyCost.zcdp(Fraction(9, 200))


def test_rho_from_epsilon_delta_is_the_largest_that_meets_it():
    eps, delta = 1.0, 1e-6
    rho = rho_from_epsilon_delta(eps, delta)
    assert epsilon_from_rho(rho.value, delta) <= eps
    # A tiny bit more rho breaks the (epsilon, delta) guarantee.
    more = rho.value * (1 + Fraction(1, 10**9))
    assert epsilon_from_rho(more, delta) > eps


def test_infinite_budget_composes():
    inf = PrivacyCost.unbounded("pure")
    assert inf + PrivacyCost.pure(1) == inf
    assert PrivacyCost.pure(5) <= inf
    assert budget_cost("zcdp", epsilon="inf", allow_infinite=True).infinite


def test_budget_exact_at_boundary_passes_one_quantum_more_fails():
    budget = PrivacyCost.pure(1)
    spent = PrivacyCost.pure("0.7")
    assert spent + PrivacyCost.pure("0.3") <= budget
    assert not spent + PrivacyCost.pure("0.3") + ONE_QUANTUM_PURE <= budget
    assert Fraction(1, 10**18) == QUANTUM


# -- the tight zCDP -> (epsilon, delta) conversion, against Google's dp-accounting --------

RHOS = [1e-6, 1e-3, 0.01, 0.1, 1.0, 10.0, 100.0]
EPSILONS = [0.01, 0.1, 0.5, 1.0, 3.0, 10.0, 50.0]
DELTAS = [1e-3, 1e-6, 1e-10]
# A dense grid of Renyi orders: dp-accounting's minimum over it is within 1e-7 of the infimum.
ORDERS = 1 + np.exp(np.linspace(math.log(0.1), math.log(1e5), 20001))


def _dp_accounting_epsilon(rho: float, delta: float, orders: np.ndarray = ORDERS) -> float:
    """dp-accounting's epsilon of rho-zCDP (RDP alpha * rho at each order) at ``delta``."""
    return float(rdp.compute_epsilon(orders, orders * rho, delta)[0])


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("rho", RHOS)
def test_epsilon_from_rho_is_dp_accountings_tight_bound(rho, delta):
    ours, alpha = zcdp_epsilon(rho, delta)
    assert epsilon_from_rho(rho, delta) == ours
    # Safe: at least dp-accounting's bound at the order it chose, so a valid epsilon.
    assert ours >= _dp_accounting_epsilon(rho, delta, np.array([alpha]))
    # Tight: no more than the best of a dense grid of orders.
    assert ours == pytest.approx(_dp_accounting_epsilon(rho, delta), rel=1e-7)


@pytest.mark.parametrize(("rho", "delta"), [(0.2, 0.5), (0.005, 0.1), (1e-14, 1e-6)])
def test_where_dp_accounting_uses_its_kl_bound_epsilon_is_zero_too(rho, delta):
    assert delta**2 + math.expm1(-rho) > 0  # dp-accounting's KL case: (0, delta)-DP
    assert epsilon_from_rho(rho, delta) == 0 == _dp_accounting_epsilon(rho, delta)


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("epsilon", EPSILONS)
def test_rho_from_epsilon_delta_is_the_largest_dp_accounting_allows(epsilon, delta):
    rho = float(rho_from_epsilon_delta(epsilon, delta).value)
    alpha = zcdp_epsilon(rho, delta)[1]
    # Safe: dp-accounting finds an order at which rho-zCDP is (epsilon, delta)-DP.
    assert _dp_accounting_epsilon(rho, delta, np.append(ORDERS, alpha)) <= epsilon
    # Tight: a millionth more rho meets epsilon at no order of the dense grid.
    assert _dp_accounting_epsilon(rho * (1 + 1e-6), delta) > epsilon


def test_the_tight_conversion_gives_more_rho_than_bun_steinke():
    loose = (math.sqrt(math.log(1e6) + 1) - math.sqrt(math.log(1e6))) ** 2  # Bun & Steinke
    rho = float(rho_from_epsilon_delta(1, 1e-6).value)
    assert 1.39 < rho / loose < 1.40  # about 1.394: noise sd 0.847 times the loose one's
    assert epsilon_from_rho(loose, 1e-6) < 0.9
