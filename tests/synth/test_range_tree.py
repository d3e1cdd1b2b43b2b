"""The range tree: least-squares consistency, its exact accuracy, real noise, the SQL macros."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

import dpsql
from dpsql import synth
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.errors import ConfigurationError
from dpsql.privacy import PrivacyCost
from dpsql.synth.measure import count_marginals
from dpsql.synth.range_tree import (
    aggregate,
    average_range_variance,
    choose_branching,
    consistent_tree,
    expand,
    leaf_information,
    noisy_tree,
    range_weights,
    tree_height,
)

from .conftest import FALSE_POSITIVE_RATE


def _design(branching: int, height: int, dims: int) -> np.ndarray:
    """Rows: every node (root first, level by level); columns: leaves; 1 where covered."""
    side = branching**height
    leaves = np.eye(side**dims).reshape((side**dims,) + (side,) * dims)
    blocks = []
    for level in range(height + 1):
        factor = branching ** (height - level)
        blocks.append(np.stack([aggregate(leaf, factor).ravel() for leaf in leaves], axis=1))
    return np.concatenate(blocks, axis=0)


def _split(values: np.ndarray, branching: int, height: int, dims: int) -> list[np.ndarray]:
    sizes = [(branching**level) ** dims for level in range(height + 1)]
    parts = np.split(values, np.cumsum(sizes)[:-1])
    return [p.reshape((branching**level,) * dims) for level, p in enumerate(parts)]


@pytest.mark.parametrize(("branching", "height", "dims"),
                         [pytest.param(2, 3, 1, id="binary-1d"),
                          pytest.param(3, 2, 1, id="ternary-1d"),
                          pytest.param(2, 2, 2, id="quadtree")])
def test_consistency_is_the_weighted_least_squares_solution(branching, height, dims):
    rng = np.random.default_rng(11)
    design = _design(branching, height, dims)
    y = rng.normal(0, 10, size=design.shape[0])
    v = rng.uniform(0.5, 4, size=design.shape[0])
    v[-1], y[-1] = 0, 0  # one leaf known exactly (like padding): the solution must keep it
    known = v == 0
    free = np.ones(design.shape[1], dtype=bool)
    free[-1] = False
    a, w = design[~known][:, free], 1 / v[~known]
    expected = np.zeros(design.shape[1])
    expected[free] = np.linalg.solve(a.T @ (a * w[:, None]), a.T @ (w * y[~known]))
    tree = consistent_tree(_split(y, branching, height, dims), _split(v, branching, height, dims),
                           branching)
    assert np.allclose(tree[-1].ravel(), expected)
    for level in range(height):
        assert np.allclose(tree[level], aggregate(tree[level + 1], branching))


def test_aggregate_and_expand():
    x = np.arange(16).reshape(4, 4)
    assert aggregate(x, 2).tolist() == [[10, 18], [42, 50]]
    assert expand(np.array([[1, 2], [3, 4]]), 2).shape == (4, 4)
    assert aggregate(expand(np.array([1.0, 2.0]), 3), 3).tolist() == [3.0, 6.0]


@pytest.mark.parametrize(("bins", "branching"), [((13,), 2), ((13,), 4), ((5, 6), 2)])
def test_leaf_covariance_is_the_inverse_information(bins, branching):
    """Propagating unit noise through consistent_tree (it is linear) gives inv(A^T W A)."""
    height = tree_height(bins, branching)
    dims = len(bins)
    side = branching**height
    level_var = 3.0
    variances = []
    for level in range(height + 1):
        factor = branching ** (height - level)
        covered = np.zeros((branching**level,) * dims, dtype=bool)
        covered[tuple(slice(0, -(-n // factor)) for n in bins)] = True
        variances.append(np.where(covered, level_var, 0.0))
    flat_var = np.concatenate([v.ravel() for v in variances])
    real = np.zeros((side,) * dims, dtype=bool)
    real[tuple(slice(0, n) for n in bins)] = True
    responses = []
    for j in np.flatnonzero(flat_var):
        unit = np.zeros(flat_var.size)
        unit[j] = 1
        responses.append(consistent_tree(_split(unit, branching, height, dims), variances,
                                         branching)[-1][real])
    r = np.array(responses)
    covariance = r.T @ (r * level_var)
    information = leaf_information(bins, branching, [1 / level_var] * (height + 1))
    assert np.allclose(covariance @ information, np.eye(information.shape[0]), atol=1e-9)


def test_the_chosen_tree_beats_a_flat_histogram_on_wide_ranges():
    """Exact variances (no sampling): 85 one-year age bins under zCDP."""
    bins = (85,)
    branching = choose_branching(bins, "zcdp")
    height = tree_height(bins, branching)
    levels = height + 1
    covariance = np.linalg.inv(leaf_information(bins, branching, [1 / levels] * levels))
    prefix = np.zeros((86, 86))
    prefix[1:, 1:] = np.cumsum(np.cumsum(covariance, 0), 1)
    worst = 0.0
    for lo, hi in itertools.combinations(range(86), 2):
        variance = prefix[hi, hi] - prefix[lo, hi] - prefix[hi, lo] + prefix[lo, lo]
        worst = max(worst, variance)
        if hi - lo >= 16:  # a flat histogram's variance for this range is hi - lo
            assert variance < (hi - lo), (lo, hi)
        if hi - lo >= 32:
            assert variance < 0.55 * (hi - lo), (lo, hi)
    assert worst < 20  # polylog: the flat histogram's worst range has variance 85
    assert average_range_variance(bins, branching, "zcdp") < 0.4


@pytest.mark.parametrize("kind", ["zcdp", "pure"])
@pytest.mark.parametrize("bins", [(9,), (40,), (85,), (9, 10)])
def test_the_default_is_never_worse_than_flat_on_average(bins, kind):
    branching = choose_branching(bins, kind)
    assert average_range_variance(bins, branching, kind) <= 1.0 + 1e-9
    assert average_range_variance(bins, 0, kind) == pytest.approx(1.0)


def test_range_weights_count_ranges():
    weight = range_weights((3,))
    assert weight.tolist() == [[3, 2, 1], [2, 4, 2], [1, 2, 3]]  # ranges of [0, 3) holding i, j


def test_real_noise_matches_the_predicted_covariance(fine_admin):
    """Leaf errors of 20 independent fits: e^T Sigma^-1 e summed is chi-square(20 * 85).

    Two-sided bound at FALSE_POSITIVE_RATE; the same check rejects noise 30% off either way.
    """
    dataset = fine_admin.policy.dataset("adult")
    domain = Domain.from_dataset(dataset, ["age"])
    exact = count_marginals(bounded_relation(fine_admin.store, dataset), domain, [("age",)])[0]
    budget = PrivacyCost.zcdp("0.01")
    branching = choose_branching((85,), "zcdp")
    statistic = 0.0
    fits = 20
    for _ in range(fits):
        leaves, spent, levels = noisy_tree(exact, branching, budget, 1)
        assert spent <= budget
        information = leaf_information((85,), branching, [1 / m["scale"] ** 2 for m in levels])
        error = leaves - exact
        statistic += float(error @ information @ error)
    dof = fits * 85
    low = stats.chi2.ppf(FALSE_POSITIVE_RATE / 2, dof)
    high = stats.chi2.isf(FALSE_POSITIVE_RATE / 2, dof)
    assert low < statistic < high
    for wrong in (0.7, 1.3):  # the statistic had we believed the noise sd were off by `wrong`
        assert not low < statistic / wrong**2 < high


def test_infinite_budget_gives_the_exact_histogram(fine_admin):
    dataset = fine_admin.policy.dataset("adult")
    domain = Domain.from_dataset(dataset, ["age", "hours_per_week"])
    source = bounded_relation(fine_admin.store, dataset)
    fitted = synth.get("range", branching="4").fit(source, domain,
                                                   PrivacyCost.unbounded("zcdp"),
                                                   np.random.default_rng(0))
    assert np.allclose(fitted.leaves, count_marginals(source, domain, [domain.names])[0])
    table = fitted.representation()
    assert table.num_rows == 85 * 15
    assert table.column_names == ["bin", "label", "lo", "hi", "bin2", "label2", "lo2", "hi2",
                                  "count"]
    sample = fitted.sample(100, np.random.default_rng(0))
    assert sample.column_names == ["age", "hours_per_week"]


def test_range_refuses_unsuitable_columns(fine_admin):
    dataset = fine_admin.policy.dataset("adult")
    budget = PrivacyCost.zcdp("0.01")
    with pytest.raises(ConfigurationError, match="numeric"):
        synth.get("range").check(Domain.from_dataset(dataset, ["sex"]), budget)
    with pytest.raises(ConfigurationError, match="one or two"):
        synth.get("range").check(Domain.from_dataset(dataset, ["age", "hours_per_week",
                                                               "race"]), budget)
    with pytest.raises(ConfigurationError, match="branching"):
        synth.get("range", branching="1")


def test_macros_answer_ranges_from_the_released_leaves(fine_store):
    with dpsql.connect(fine_store, "admin") as admin:
        admin.release("adult", synthesizer="range", epsilon=1, columns=["age"], name="ages")
        admin.release("adult", synthesizer="range", epsilon=1,
                      columns=["age", "hours_per_week"], name="age_hours")
        cur = admin.store.cursor()

        def one(sql):
            return cur.execute(sql).fetchall()[0][0]

        counts = cur.sql("SELECT count FROM released.ages ORDER BY lo").fetchnumpy()["count"]
        assert one("SELECT udfs.dp_range_count('ages', 20, 30)") == \
            pytest.approx(counts[20:30].sum())
        # A range cutting bins counts the overlapping fraction of each.
        assert one("SELECT udfs.dp_range_count('ages', 20.5, 22.25)") == \
            pytest.approx(0.5 * counts[20] + counts[21] + 0.25 * counts[22])
        assert one("SELECT udfs.dp_range_count('ages', -1e9, 1e9)") == \
            pytest.approx(counts.sum())
        two = cur.sql("SELECT lo, hi, lo2, hi2, count FROM released.age_hours").fetchnumpy()
        inside = (two["lo"] >= 20) & (two["hi"] <= 40) & (two["lo2"] >= 35) & (two["hi2"] <= 49)
        assert one("SELECT udfs.dp_range_count2('age_hours', 20, 40, 35, 49)") == \
            pytest.approx(two["count"][inside].sum())
        # The name is one identifier in schema released: it cannot reach the raw table.
        for name in ["adult", 'x"."main"."adult', "../adult"]:
            with pytest.raises(Exception, match="does not exist"):
                one(f"SELECT udfs.dp_range_count('{name}', 0, 100)")
