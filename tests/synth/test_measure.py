"""measure.py: exact counts in one DuckDB pass, and noise of the calibrated scale."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from dpsql import noise
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.privacy import PrivacyCost
from dpsql.synth.measure import count_marginals, measure_marginals

from ..conftest import ADULT_SAMPLE
from .conftest import mean_square_ratio_ok


def _domain(session, columns):
    return Domain.from_dataset(session.policy.dataset("adult"), columns)


def test_counts_match_pandas_over_the_full_domain(fine_admin):
    domain = _domain(fine_admin, ["age", "sex", "race", "hours_per_week"])
    source = bounded_relation(fine_admin.store, fine_admin.policy.dataset("adult"))
    marginals = [("age",), ("sex", "race"), ("race", "hours_per_week"), ()]
    counts = count_marginals(source, domain, marginals)
    frame = pd.read_csv(ADULT_SAMPLE)
    frame["hours_per_week"] = frame["hours_per_week"] // 7
    assert counts[0].shape == (85,)
    assert np.array_equal(counts[0], np.bincount(frame["age"], minlength=85))
    expected = pd.crosstab(frame["sex"], frame["race"]).reindex(
        index=range(2), columns=range(5), fill_value=0).to_numpy()
    assert np.array_equal(counts[1], expected)
    assert counts[2].sum() == len(frame)
    assert counts[2].shape == (5, 15)  # empty cells of the full domain are present
    assert int(counts[3]) == len(frame)


@pytest.mark.parametrize(("accounting", "excess_kurtosis"),
                         [pytest.param("zcdp", 0.0, id="gaussian"),
                          pytest.param("pure", 3.0, id="laplace")])
def test_noise_has_the_calibrated_scale(request, accounting, excess_kurtosis):
    session = request.getfixturevalue("fine_admin" if accounting == "zcdp" else "pure_admin")
    columns = ["age", "occupation", "native_country"]  # 85 * 15 * 42 = 53,550 cells
    domain = _domain(session, columns)
    source = bounded_relation(session.store, session.policy.dataset("adult"))
    budget = PrivacyCost.zcdp("0.005") if accounting == "zcdp" else PrivacyCost.pure("0.1")
    exact = count_marginals(source, domain, [columns])[0]
    [measured] = measure_marginals(source, domain, [columns], budget)
    residuals = (measured.noisy - exact).ravel()
    assert measured.cost <= budget
    assert measured.mechanism == ("discrete_gaussian" if accounting == "zcdp"
                                  else "discrete_laplace")
    assert measured.scale == pytest.approx(10, rel=1e-6)  # sigma = 1/sqrt(2 rho), b = 1/eps
    variance = noise.std(measured.mechanism, measured.scale) ** 2
    ok, ratio = mean_square_ratio_ok(residuals, variance, excess_kurtosis)
    assert ok, ratio
    # The same check rejects a noise scale off by 30% either way.
    for wrong in (0.7, 1.3):
        assert not mean_square_ratio_ok(residuals, variance * wrong**2, excess_kurtosis)[0]


def test_shares_split_the_budget_and_never_exceed_it(fine_admin):
    domain = _domain(fine_admin, ["age", "sex", "race"])
    source = bounded_relation(fine_admin.store, fine_admin.policy.dataset("adult"))
    budget = PrivacyCost.zcdp("0.01")
    measured = measure_marginals(source, domain, [("age",), ("sex", "race"), ()], budget,
                                 shares=[2, 1, 1])
    total = measured[0].cost + measured[1].cost + measured[2].cost
    assert total <= budget
    assert measured[0].scale < measured[1].scale  # the larger share gets less noise
    assert measured[1].scale == pytest.approx(measured[2].scale)
    for a, b in itertools.combinations(measured, 2):
        assert a.columns != b.columns


def test_infinite_budget_measures_exactly(fine_admin):
    domain = _domain(fine_admin, ["sex", "race"])
    source = bounded_relation(fine_admin.store, fine_admin.policy.dataset("adult"))
    exact = count_marginals(source, domain, [("sex", "race")])[0]
    [measured] = measure_marginals(source, domain, [("sex", "race")],
                                   PrivacyCost.unbounded("zcdp"))
    assert np.array_equal(measured.noisy, exact)
    assert measured.scale == 0
