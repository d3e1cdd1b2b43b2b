"""Rubin's rules against hand-computed examples, and the statsmodels helper."""

from __future__ import annotations

import math
from collections.abc import Callable

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import statsmodels.formula.api as smf
from scipy import stats

from dpsql.analysis import rubin
from dpsql.errors import ConfigurationError


def test_combine_matches_hand_computation() -> None:
    # q = 0..9, u = 2, complete-data dof nu_com = 20 (Barnard & Rubin 1999):
    # q_bar = 4.5, b = 82.5 / 9 = 55/6, (1 + 1/10) b = 121/12, T = 121/12 - 2 = 97/12,
    # nu_m = 9 (1 - 2 / (121/12))^2 = 9 (97/121)^2 = 84681/14641,
    # nu_obs = (20 + 1) / (20 + 3) * 20 = 420/23, nu = 1 / (14641/84681 + 23/420) = 4.39256.
    out = rubin.combine(np.arange(10.0), [2.0] * 10, complete_dof=20)
    assert out.estimate == pytest.approx(4.5)
    assert out.between == pytest.approx(55 / 6)
    assert out.within == pytest.approx(2.0)
    assert out.std_error == pytest.approx(math.sqrt(97 / 12))
    dof = 1 / (14641 / 84681 + 23 / 420)
    assert out.dof == pytest.approx(dof)
    assert out.dof == pytest.approx(4.39256, abs=1e-5)
    assert not out.adjusted
    assert not out.unreliable
    assert out.reason == ""
    half = stats.t.ppf(0.975, dof) * math.sqrt(97 / 12)
    assert out.ci_low == pytest.approx(4.5 - half)
    assert out.ci_high == pytest.approx(4.5 + half)
    assert out.copies == 10


def test_unknown_complete_dof_is_the_large_sample_rule() -> None:
    # The same case without nu_com: nu = nu_m (Raghunathan, Reiter & Rubin 2003).
    out = rubin.combine(np.arange(10.0), [2.0] * 10)
    assert out.dof == pytest.approx(84681 / 14641)
    huge = rubin.combine(np.arange(10.0), [2.0] * 10, complete_dof=1e12)
    assert huge.dof == pytest.approx(out.dof)


def test_few_degrees_of_freedom_warn_and_flag() -> None:
    # q = 1..4, u = 0.5: b = 5/3, T = (1 + 1/4) 5/3 - 0.5 = 19/12,
    # nu = 3 (1 - 4 * 0.5 / (5 * 5/3))^2 = 3 * 0.76^2 = 1.7328 < 3.
    with pytest.warns(rubin.RubinWarning, match="df < 3: nu = 1.73"):
        out = rubin.combine([1.0, 2.0, 3.0, 4.0], [0.5] * 4)
    assert out.unreliable
    assert "nu = 1.73" in out.reason
    assert out.dof == pytest.approx(1.7328)
    assert out.std_error == pytest.approx(math.sqrt(19 / 12))


def test_between_near_within_is_flagged_not_silent() -> None:
    # (1 + 1/m) b just above u_bar: nu -> 0, and the t interval explodes (the review's
    # +-1e75). The rule's interval is kept, but never without the flag and the warning.
    with pytest.warns(rubin.RubinWarning, match="df < 3"):
        out = rubin.combine([0.0, 1.0], [0.75 - 1e-9] * 2)
    assert out.dof < 1e-15
    assert out.ci_high - out.estimate > 1e10
    assert out.unreliable


def test_between_dominating_within_warns_and_flags() -> None:
    # b = 2.5 (q = 1..5), u = 0.01: (1 + 1/5) b = 3 = 300 u_bar, nu = 4 (1 - 1/300)^2 >= 3.
    with pytest.warns(rubin.RubinWarning, match="dominates"):
        out = rubin.combine([1.0, 2.0, 3.0, 4.0, 5.0], [0.01] * 5)
    assert out.dof > 3
    assert out.unreliable
    assert "300 x u_bar" in out.reason
    # At 9 x u_bar (below the threshold of 10) nothing is said.
    calm = rubin.combine([1.0, 2.0, 3.0, 4.0, 5.0], [3 / 9] * 5)
    assert not calm.unreliable


def test_negative_total_variance_uses_reiter_correction() -> None:
    # b = 0.005, u_bar = 1: T = 1.5 * 0.005 - 1 < 0, so T* = (n_syn / n) u_bar, with the
    # complete-data degrees of freedom (a normal interval when they are unknown).
    with pytest.warns(rubin.RubinWarning, match="T <= 0"):
        out = rubin.combine([1.0, 1.1], [1.0, 1.0])
    assert out.adjusted
    assert out.unreliable
    assert out.std_error == pytest.approx(1.0)
    assert math.isinf(out.dof)
    assert out.ci_high - out.estimate == pytest.approx(stats.norm.ppf(0.975))
    with pytest.warns(rubin.RubinWarning):
        half = rubin.combine([1.0, 1.1], [1.0, 1.0], rows_ratio=0.5, complete_dof=7)
    assert half.std_error == pytest.approx(math.sqrt(0.5))
    assert half.dof == pytest.approx(8 / 10 * 7)


def test_identical_estimates_give_a_normal_interval() -> None:
    with pytest.warns(rubin.RubinWarning, match="T <= 0"):
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


def test_non_positive_complete_dof_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="complete_dof"):
        rubin.combine(np.arange(10.0), [2.0] * 10, complete_dof=0)


def logistic_copies(m: int = 10, n: int = 400) -> pd.DataFrame:
    """Copies as a synthesizer makes them: each from its own posterior draw of the model."""
    rng = np.random.default_rng(11)
    frames = []
    for i in range(m):
        intercept, slope, other = np.array([-0.5, 1.0, 0.0]) + rng.normal(0, 0.4, 3)
        x1 = rng.integers(0, 2, n)
        x2 = rng.integers(0, 2, n)
        y = rng.random(n) < 1 / (1 + np.exp(-(intercept + slope * x1 + other * x2)))
        frames.append(pd.DataFrame({"y": y.astype(int), "x1": x1, "x2": x2, "_copy": i}))
    return pd.concat(frames, ignore_index=True)


def test_fit_formula_combines_each_coefficient() -> None:
    data = logistic_copies()
    table = rubin.fit_formula(data, "y ~ x1 + x2", "logit")
    assert list(table.index) == ["Intercept", "x1", "x2"]
    per_copy = [smf.logit("y ~ x1 + x2", part).fit(disp=0) for _, part in data.groupby("_copy")]
    # The complete-data degrees of freedom are the fits' residual ones, n - 3.
    assert {r.df_resid for r in per_copy} == {397}
    expected = rubin.combine([r.params["x1"] for r in per_copy],
                             [r.bse["x1"] ** 2 for r in per_copy], complete_dof=397)
    assert table.loc["x1", "estimate"] == pytest.approx(expected.estimate)
    assert table.loc["x1", "std_error"] == pytest.approx(expected.std_error)
    assert table.loc["x1", "dof"] == pytest.approx(expected.dof)
    assert table.loc["x1", "copies"] == 10
    assert not table["unreliable"].any()
    # Arrow tables (as read from a release) and DuckDB relations work the same way.
    again = rubin.fit_formula(pa.Table.from_pandas(data), "y ~ x1 + x2")
    assert again.loc["x1", "estimate"] == pytest.approx(expected.estimate)
    con = duckdb.connect()
    con.register("release", data)
    related = rubin.fit_formula(con.sql("SELECT * FROM release"), "y ~ x1 + x2")
    assert related.loc["x1", "estimate"] == pytest.approx(expected.estimate)


@pytest.mark.parametrize("make", [
    pytest.param(lambda d: pa.Table.from_pandas(d).to_reader(), id="arrow_reader"),
    pytest.param(lambda d: [part for _, part in d.groupby("_copy")], id="list_of_frames"),
    pytest.param(lambda d: d.to_dict("list"), id="dict"),
    pytest.param(lambda d: d.to_numpy(), id="numpy"),
])
def test_other_inputs_are_refused(make: Callable[[pd.DataFrame], object]) -> None:
    # An Arrow stream once went through as a list of record batches, each fitted as a
    # "copy": garbage categories and no error. Only whole tables are accepted now.
    data = make(logistic_copies(m=2, n=50))
    with pytest.raises(TypeError, match="DuckDB relation, a pandas DataFrame or a pyarrow"):
        rubin.fit_formula(data, "y ~ x1 + x2")


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
    with pytest.warns(rubin.RubinWarning, match="m = 3"):
        table = rubin.fit_formula(data, "y ~ x1 + x2", "logit", maxiter=5)
    assert table["unreliable"].all()
    assert (table["unconverged_copies"] >= 1).all()
