"""independent and joint: exact with an infinite budget, honest costs, state round trips."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from dpsql import synth
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.errors import ConfigurationError, ReleaseError
from dpsql.privacy import PrivacyCost
from dpsql.synth.histogram import (
    FittedHistogram,
    combine_row_estimates,
    probabilities,
    project_simplex,
)
from dpsql.synth.measure import count_marginals

from .conftest import FALSE_POSITIVE_RATE

COLUMNS = ["age", "sex", "race", "income_50k"]


def _setup(session, columns=COLUMNS):
    dataset = session.policy.dataset("adult")
    domain = Domain.from_dataset(dataset, columns)
    return bounded_relation(session.store, dataset), domain


# -- post-processing -----------------------------------------------------------------------


@pytest.mark.parametrize("total", [1.0, 7.5, 100.0])
def test_projection_is_the_nearest_point_of_the_scaled_simplex(total):
    rng = np.random.default_rng(3)
    x = rng.normal(2, 5, size=40)
    p = project_simplex(x, total)
    assert p.min() >= 0
    assert p.sum() == pytest.approx(total)
    # Optimality (KKT): p = max(x - theta, 0) for one theta, and no other simplex point is nearer.
    theta = (x - p)[p > 0]
    assert np.allclose(theta, theta[0])
    assert np.all(x[p == 0] <= theta[0] + 1e-12)
    for _ in range(200):
        other = rng.dirichlet(np.ones(x.size)) * total
        assert np.sum((x - p) ** 2) <= np.sum((x - other) ** 2)


def test_clip_and_project_differ_on_sparse_noise():
    noisy = np.array([100, 3, -2, 4, -5, 1, 0, 2])
    clipped = probabilities(noisy, "clip", 100)
    projected = probabilities(noisy, "project", 100)
    assert clipped.sum() == pytest.approx(1)
    assert projected.sum() == pytest.approx(1)
    assert projected[0] > clipped[0]  # projection takes mass back from noise-only cells
    assert probabilities(np.array([-3, -1]), "clip", 10).tolist() == [0.5, 0.5]


def test_inverse_variance_row_estimate():
    assert combine_row_estimates([(100, 1), (110, 1)]) == pytest.approx(105)
    assert combine_row_estimates([(100, 1), (200, 99)]) == pytest.approx(101)
    assert combine_row_estimates([(100, 0), (200, 1)]) == 100


# -- fitting --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["independent", "joint"])
def test_infinite_budget_reproduces_the_exact_marginals(fine_admin, name):
    source, domain = _setup(fine_admin)
    fitted = synth.get(name).fit(source, domain, PrivacyCost.unbounded("zcdp"),
                                 np.random.default_rng(0))
    assert fitted.rows == 5000
    marginals = [(c,) for c in COLUMNS] if name == "independent" else [tuple(COLUMNS)]
    for exact, table in zip(count_marginals(source, domain, marginals), fitted.tables, strict=True):
        assert np.allclose(table, exact / exact.sum())


def test_joint_samples_follow_the_fitted_table(fine_admin):
    source, domain = _setup(fine_admin, ["sex", "race", "income_50k"])
    fitted = synth.get("joint").fit(source, domain, PrivacyCost.unbounded("zcdp"),
                                    np.random.default_rng(0))
    codes = fitted.sample(20_000, np.random.default_rng(1))
    flat = np.ravel_multi_index([codes.column(c).to_numpy() for c in domain.names], domain.shape)
    observed = np.bincount(flat, minlength=domain.size())
    expected = fitted.tables[0].ravel() * 20_000
    keep = expected > 0
    assert observed[~keep].sum() == 0
    # Chi-square goodness of fit; fails a correct sampler with probability FALSE_POSITIVE_RATE.
    statistic = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    assert statistic < stats.chi2.isf(FALSE_POSITIVE_RATE, keep.sum() - 1)
    # ... and rejects samples drawn as if the columns were independent.
    wrong = synth.get("independent").fit(source, domain, PrivacyCost.unbounded("zcdp"),
                                         np.random.default_rng(0))
    w = wrong.sample(20_000, np.random.default_rng(2))
    wrong_flat = np.ravel_multi_index([w.column(c).to_numpy() for c in domain.names],
                                      domain.shape)
    observed_wrong = np.bincount(wrong_flat, minlength=domain.size())
    statistic_wrong = ((observed_wrong[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    assert statistic_wrong > stats.chi2.isf(FALSE_POSITIVE_RATE, keep.sum() - 1)


@pytest.mark.parametrize("name", ["independent", "joint"])
@pytest.mark.parametrize("kind", ["zcdp", "pure"])
def test_spent_is_the_sum_of_measurements_and_within_budget(request, name, kind):
    session = request.getfixturevalue("fine_admin" if kind == "zcdp" else "pure_admin")
    source, domain = _setup(session)
    budget = PrivacyCost.zcdp("0.02") if kind == "zcdp" else PrivacyCost.pure("1")
    fitted = synth.get(name).fit(source, domain, budget, np.random.default_rng(0))
    assert fitted.spent <= budget
    assert fitted.spent.kind == kind
    described = fitted.describe()
    expected_measurements = len(COLUMNS) + 1 if name == "independent" else 2
    assert len(described["measurements"]) == expected_measurements
    assert described["measurements"][-1]["columns"] == []  # the noisy row count
    assert abs(fitted.rows - 5000) < 500


def test_count_share_zero_derives_rows_from_the_marginals(fine_admin):
    source, domain = _setup(fine_admin)
    fitted = synth.get("independent", count_share="0").fit(
        source, domain, PrivacyCost.zcdp("0.05"), np.random.default_rng(0))
    assert len(fitted.describe()["measurements"]) == len(COLUMNS)
    assert fitted.describe()["diagnostics"]["row_count"]["source"] == "dp"
    assert abs(fitted.rows - 5000) < 300


def test_state_round_trips_through_json(fine_admin):
    source, domain = _setup(fine_admin)
    joint = synth.get("joint")
    fitted = joint.fit(source, domain, PrivacyCost.zcdp("0.02"), np.random.default_rng(0))
    state = json.loads(json.dumps(fitted.state()))
    restored = joint.restore(state, domain)
    assert isinstance(restored, FittedHistogram)
    assert restored.rows == fitted.rows
    assert restored.spent == fitted.spent
    for a, b in zip(restored.tables, fitted.tables, strict=True):
        assert np.array_equal(a, b)
    assert restored.sample(50, np.random.default_rng(5)).equals(
        fitted.sample(50, np.random.default_rng(5)))
    with pytest.raises(ReleaseError, match="domain"):
        joint.restore(state, Domain.from_dataset(fine_admin.policy.dataset("adult"), ["sex"]))


def test_options_are_converted_and_checked():
    joint = synth.get("joint", postprocess="clip", max_cells="10", expected_rows="500")
    assert (joint.postprocess, joint.max_cells, joint.expected_rows) == ("clip", 10, 500)
    assert synth.get("joint").postprocess == "project"
    assert synth.get("independent").postprocess == "clip"
    with pytest.raises(ConfigurationError, match="postprocess"):
        synth.get("independent", postprocess="round")
    with pytest.raises(ConfigurationError, match="count_share"):
        synth.get("joint", count_share="1.5")
    with pytest.raises(ConfigurationError, match="did you mean 'max_cells'"):
        synth.get("joint", max_cell="3")


def test_joint_refuses_hopeless_tables_from_public_facts(fine_admin):
    _, domain = _setup(fine_admin, ["age", "occupation", "native_country"])  # 53,550 cells
    budget = PrivacyCost.zcdp("0.001")
    with pytest.raises(ReleaseError, match="max_cells"):
        synth.get("joint", max_cells="1000").check(domain, budget)
    with pytest.raises(ReleaseError, match="phantom rows"):
        synth.get("joint", expected_rows="5000").check(domain, budget)
    synth.get("joint", expected_rows="5000").check(domain, PrivacyCost.zcdp("1000"))
    synth.get("joint").check(domain, budget)  # no reference row count: warn after the fit


def test_a_mostly_noise_joint_table_warns(fine_admin):
    source, domain = _setup(fine_admin, ["age", "occupation", "native_country"])
    fitted = synth.get("joint").fit(source, domain, PrivacyCost.zcdp("0.001"),
                                    np.random.default_rng(0))
    warnings = fitted.describe()["diagnostics"]["warnings"]
    assert len(warnings) == 1
    assert "mostly noise" in warnings[0]
