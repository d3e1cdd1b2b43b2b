"""The noise in answers has the calibrated scale, and the intervals cover the truth.

One grouped query over ~10,000 public cells gives ~10,000 independent noise
draws (noisy answer minus the exact count from plain DuckDB). Their sample
variance is compared with the variance of the mechanism at the scale computed
*here* from the sensitivity and the share (not read back from dpsql).

False-positive rate: the standardized sample variance is asymptotically normal;
the acceptance band is 6 standard errors (estimated from the draws), so a
correct implementation fails with probability about 2e-9 per check. Power: the
same check is run against the variance of a scale 0.7x and 1.3x the right one
and must reject both (their variances differ by 51% and 69%, over 20 standard
errors). The sampler is seeded per test (see conftest), so runs are repeatable.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import dpsql
from dpsql import noise
from tests.conftest import ADULT_POLICY
from tests.query.conftest import plain, with_budgets

GRID = ("SELECT dp_bin(capital_gain, 1) AS g, dp_bin(hours_per_week, 1) AS h, {agg} AS v "
        "FROM adult GROUP BY 1, 2")
BAND = 6.0


def noise_draws(session: dpsql.Session, agg: str) -> np.ndarray:
    answer = session.sql(GRID.format(agg=agg))
    exact = {(g, h): v for g, h, v in plain(session, GRID.format(agg=agg))}
    rows = answer.table.to_pylist()
    assert len(rows) == 100 * 99  # every public cell, empty ones included
    return np.array([r["v"] - (exact.get((r["g"], r["h"])) or 0) for r in rows], dtype=float)


def variance_z(draws: np.ndarray, variance: float) -> float:
    """(sample variance - variance) in standard errors of the sample variance."""
    squares = draws**2  # the noise has mean 0
    return float((squares.mean() - variance) / (squares.std(ddof=1) / math.sqrt(draws.size)))


def check_scale(draws: np.ndarray, mechanism: str, scale: float) -> None:
    assert abs(draws.mean()) < BAND * draws.std() / math.sqrt(draws.size)
    assert abs(variance_z(draws, noise.std(mechanism, scale) ** 2)) < BAND
    for wrong in (0.7, 1.3):
        assert abs(variance_z(draws, noise.std(mechanism, wrong * scale) ** 2)) > BAND


@pytest.fixture
def pure_session(build: Callable[..., Path]) -> dpsql.Session:
    text = with_budgets(ADULT_POLICY, accounting="pure", budget={"epsilon": 10},
                        cap={"epsilon": 1}, default={"epsilon": 0.5})
    return dpsql.connect(build(text), "alice")


@pytest.fixture
def zcdp_session(build: Callable[..., Path]) -> dpsql.Session:
    text = with_budgets(ADULT_POLICY, accounting="zcdp", budget={"rho": 1},
                        cap={"rho": 0.5}, default={"rho": 0.02})
    return dpsql.connect(build(text), "alice")


def test_count_noise_is_laplace_with_scale_1_over_epsilon(pure_session: dpsql.Session) -> None:
    with pure_session:
        draws = noise_draws(pure_session, "COUNT(*)")
    assert np.all(draws == np.round(draws))  # integer noise on integer counts
    check_scale(draws, "discrete_laplace", 1 / 0.5)


def test_sum_noise_is_laplace_with_the_bound_as_sensitivity(pure_session: dpsql.Session) -> None:
    with pure_session:
        draws = noise_draws(pure_session, "SUM(age)")  # age in [0, 84]
    check_scale(draws, "discrete_laplace", 84 / 0.5)


def test_count_noise_is_gaussian_under_zcdp(zcdp_session: dpsql.Session) -> None:
    with zcdp_session:
        draws = noise_draws(zcdp_session, "COUNT(*)")
    sigma = math.sqrt(1 / (2 * 0.02))  # sigma^2 = sensitivity^2 / (2 rho)
    check_scale(draws, "discrete_gaussian", sigma)
    # The shape too: a Laplace of the same variance has kurtosis 6, the Gaussian 3.
    assert abs(stats.kurtosis(draws, fisher=False) - 3) < 0.3


def test_distinct_count_noise_is_count_noise(zcdp_session: dpsql.Session) -> None:
    """COUNT(DISTINCT) has COUNT(*)'s sensitivity (1 here: no privacy unit), so its noise."""
    with zcdp_session:
        draws = noise_draws(zcdp_session, "COUNT(DISTINCT age)")
    check_scale(draws, "discrete_gaussian", math.sqrt(1 / (2 * 0.02)))


def test_intervals_cover_at_their_level(zcdp_session: dpsql.Session) -> None:
    """95% intervals miss in about 5% of cells. With n = 9,900 cells, the miss count is
    Binomial(n, p) with p <= 0.05; the bounds are 6 standard deviations wide (FP ~2e-9)."""
    with zcdp_session:
        zcdp_session.sql("SET dpsql.rho = 0.0005")  # sigma ~ 31.6: discreteness negligible
        zcdp_session.sql("SET dpsql.ci = 0.95")
        sql = GRID.format(agg="COUNT(*)")
        answer = zcdp_session.sql(sql)
        exact = {(g, h): v for g, h, v in plain(zcdp_session, sql)}
    rows = answer.table.to_pylist()
    misses = sum(not (r["v_ci_low"] <= (exact.get((r["g"], r["h"])) or 0) <= r["v_ci_high"])
                 for r in rows)
    n = len(rows)
    sd = math.sqrt(n * 0.05 * 0.95)
    assert abs(misses - 0.05 * n) < BAND * sd
    half = answer.columns["v"]["ci_halfwidth"]
    sigma = float(noise.used_gaussian_sigma2(Fraction(1) / (2 * Fraction("0.0005")))) ** 0.5
    assert half == noise.ci_halfwidth("discrete_gaussian", sigma, 0.95)
