"""Rubin's rules against hand-computed examples, and the statsmodels helper."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import statsmodels.formula.api as smf
from scipy import stats

from dpsql.analysis import rubin
from dpsql.errors import ConfigurationError


def test_combine_matches_hand_computation() -> None:
    # q = 1..4, u = 0.5: q_bar = 2.5, b = 5/3, u_bar = 0.5,
    # T = (1 + 1/4) 5/3 - 0.5 = 19/12, nu = 3 (1 - 4*0.5 / (5 * 5/3))^2 = 3 * 0.76^2 = 1.7328.
    out = rubin.combine([1.0, 2.0, 3.0, 4.0], [0.5] * 4)
    assert out.estimate == pytest.approx(2.5)
    assert out.between == pytest.approx(5 / 3)
    assert out.within == pytest.approx(0.5)
    assert out.std_error == pytest.approx(math.sqrt(19 / 12))
    assert out.dof == pytest.approx(1.7328)
    assert not out.adjusted
    half = stats.t.ppf(0.975, 1.7328) * math.sqrt(19 / 12)
    assert out.ci_low == pytest.approx(2.5 - half)
    assert out.ci_high == pytest.approx(2.5 + half)
    assert out.copies == 4


def test_negative_total_variance_uses_reiter_correction() -> None:
    # b = 0.005, u_bar = 1: T = 1.5 * 0.005 - 1 < 0, so T* = (n_syn / n) u_bar.
    out = rubin.combine([1.0, 1.1], [1.0, 1.0])
    assert out.adjusted
    assert out.std_error == pytest.approx(1.0)
    half = rubin.combine([1.0, 1.1], [1.0, 1.0], rows_ratio=0.5)
    assert half.std_error == pytest.approx(math.sqrt(0.5))


def test_identical_estimates_give_a_normal_interval() -> None:
    out = rubin.combine([2.0, 2.0, 2.0], [0.25, 0.25, 0.25])
    assert math.isinf(out.dof)
    assert out.ci_high - out.estimate == pytest.approx(stats.norm.ppf(0.975) * 0.5)


@pytest.mark.parametrize(("estimates", "variances"), [
    pytest.param([1.0], [1.0], id="one_copy"),
    pytest.param([1.0, 2.0], [1.0], id="length_mismatch"),
    pytest.param([1.0, 2.0], [-1.0, 1.0], id="negative_variance"),
    pytest.param([1.0, float("nan")], [1.0, 1.0], id="nan"),
])
def test_bad_input_is_refused(estimates: list[float], variances: list[float]) -> None:
    with pytest.raises(ConfigurationError):
        rubin.combine(estimates, variances)


def logistic_copies(m: int = 5, n: int = 400) -> pd.DataFrame:
    rng = np.random.default_rng(11)
    frames = []
    for i in range(m):
        x1 = rng.integers(0, 2, n)
        x2 = rng.integers(0, 2, n)
        y = rng.random(n) < 1 / (1 + np.exp(-(x1 - 0.5)))
        frames.append(pd.DataFrame({"y": y.astype(int), "x1": x1, "x2": x2, "_copy": i}))
    return pd.concat(frames, ignore_index=True)


def test_fit_formula_combines_each_coefficient() -> None:
    data = logistic_copies()
    table = rubin.fit_formula(data, "y ~ x1 + x2", "logit")
    assert list(table.index) == ["Intercept", "x1", "x2"]
    per_copy = [smf.logit("y ~ x1 + x2", part).fit(disp=0) for _, part in data.groupby("_copy")]
    expected = rubin.combine([r.params["x1"] for r in per_copy],
                             [r.bse["x1"] ** 2 for r in per_copy])
    assert table.loc["x1", "estimate"] == pytest.approx(expected.estimate)
    assert table.loc["x1", "std_error"] == pytest.approx(expected.std_error)
    assert table.loc["x1", "copies"] == 5
    # Arrow tables (as read from a release) and lists of frames work the same way.
    again = rubin.fit_formula(pa.Table.from_pandas(data), "y ~ x1 + x2")
    assert again.loc["x1", "estimate"] == pytest.approx(expected.estimate)


def test_max_std_error_drops_wild_copies() -> None:
    data = logistic_copies()
    table = rubin.fit_formula(data, "y ~ x1 + x2", "logit", max_std_error=1e-6)
    assert table.empty


def test_release_without_copy_column_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="_copy"):
        rubin.fit_formula(pd.DataFrame({"y": [0, 1], "x": [1, 2]}), "y ~ x")


def test_mixed_posterior_weighs_copies_equally() -> None:
    a = np.zeros((10, 2))
    b = np.ones((4, 2))
    mixed = rubin.mix_posteriors([a, b])
    assert mixed.shape == (8, 2)
    assert mixed.mean() == pytest.approx(0.5)
    low, high = rubin.credible_interval(mixed, 0.5)
    assert low.shape == (2,)
    assert np.all(low <= high)
    with pytest.raises(ConfigurationError):
        rubin.mix_posteriors([a])


def test_non_converged_copies_are_counted_not_raised() -> None:
    # A perfectly separated copy makes the logit optimizer give up.
    data = logistic_copies(m=3)
    separated = data["_copy"] == 0
    data.loc[separated, "y"] = data.loc[separated, "x1"]
    table = rubin.fit_formula(data, "y ~ x1 + x2", "logit", maxiter=5)
    assert (table["unconverged_copies"] >= 1).all()
