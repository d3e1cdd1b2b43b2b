"""Fidelity measures (MODP sec. 5, private-pgm's workload error) and the HTML report."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.analysis.fidelity import (
    bootstrap_ideal,
    crosstabs,
    evaluate_release,
    figure_of_merit,
    log_discrepancy,
    score,
    workload_error,
    z_statistic,
)
from dpsql.analysis.report import write_report
from dpsql.errors import AccessDenied, ReleaseError

from ..release.conftest import release_policy


def test_log_discrepancy_uses_one_pseudocount():
    d = log_discrepancy(np.array([0.0, 9.0, 99.0]), np.array([0.0, 19.0, 99.0]))
    assert d.tolist() == pytest.approx([0.0, math.log(2), 0.0])


def test_z_is_the_two_proportion_statistic():
    # 30 of 100 vs 20 of 100: pooled 0.25, z = 0.1 / sqrt(0.25 * 0.75 * 0.02)
    z = z_statistic(np.array([30.0]), 100, np.array([20.0]), 100)
    assert z[0] == pytest.approx(0.1 / math.sqrt(0.25 * 0.75 * 0.02))
    assert z_statistic(np.array([0.0]), 100, np.array([0.0]), 50)[0] == 0


def test_figure_of_merit_blends_d_and_z():
    fm = figure_of_merit(np.array([0.1, 0.2, 0.0]), np.array([1.0, 2.0, 3.0]))
    assert fm.tolist() == pytest.approx([1.0, 2.0, 0.0])  # one unit: 10% or one sd


def test_workload_error_is_half_l1_of_normalised_two_way_tables():
    true = {(0,): np.array([1, 1]), (1,): np.array([1, 1]), (0, 1): np.array([[1, 0], [0, 1]])}
    synthetic = {(0,): np.array([1, 1]), (1,): np.array([1, 1]),
                 (0, 1): np.array([[1, 1], [1, 1]])}
    assert workload_error(true, synthetic) == pytest.approx(0.5)
    assert workload_error(true, true) == 0


def test_crosstabs_match_pandas_and_skip_codes_outside_the_domain():
    rng = np.random.default_rng(0)
    codes = np.stack([rng.integers(0, 3, 500), rng.integers(0, 4, 500),
                      rng.integers(-1, 2, 500)], axis=1)
    tabs = crosstabs(codes, [3, 4, 2])
    frame = pd.DataFrame(codes, columns=["a", "b", "c"])
    assert np.array_equal(tabs[(0, 1)], pd.crosstab(frame.a, frame.b).to_numpy())
    assert tabs[(2,)].sum() == (codes[:, 2] >= 0).sum()
    assert set(tabs) == {(0,), (1,), (2,), (0, 1), (0, 2), (1, 2)}


def test_identical_tables_score_zero_and_shuffled_columns_do_not():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 3, 2000)
    codes = np.stack([a, (a + rng.integers(0, 2, 2000)) % 3], axis=1)
    same = score(codes, codes, [3, 3]).summary()
    assert same["median_d"] == 0
    assert same["workload_error"] == 0
    assert same["mean_z"] == 0
    shuffled = codes.copy()
    shuffled[:, 1] = rng.permutation(shuffled[:, 1])  # same 1-way margins, no correlation
    broken = score(codes, shuffled, [3, 3])
    assert broken.workload_error > 0.2
    ideal = bootstrap_ideal(codes, [3, 3], np.random.default_rng(2))
    assert ideal.workload_error < broken.workload_error / 5
    one_way = broken.order == 1
    assert broken.d[one_way].max() == 0  # margins untouched by the shuffle


@pytest.fixture
def evaluated_store(make_store):
    """Releases at epsilon 1000: noise sd ~0.003 of a count, so the comparisons below are
    deterministic in practice (sampling uses seeded generators)."""
    path = make_store(release_policy(budget="{epsilon: 5000}", user_budget="{epsilon: 5000}",
                                     synthesizers="independent, joint, range"))
    columns = ["age", "sex", "race", "income_50k"]
    with dpsql.connect(path, "admin") as admin:
        admin.release("adult", synthesizer="joint", epsilon=1000, columns=columns, name="good",
                      seed=1)
        admin.release("adult", synthesizer="independent", epsilon=1000, columns=columns,
                      name="indep", seed=1, copies=2)
    return path


def test_evaluate_release_scores_against_the_real_data(evaluated_store):
    with dpsql.connect(evaluated_store, "admin") as admin:
        good = evaluate_release(admin.context(), "good", seed=3)
        indep = evaluate_release(admin.context(), "indep", copy=2, seed=3)
        audit = admin.audit(last=1)[0]
    assert (audit["action"], audit["outcome"]) == ("evaluate", "evaluated")
    assert good.synthetic.rows_true == 5000
    assert good.synthetic.d.size == 9 + 2 + 5 + 2 + 9 * 2 + 9 * 5 + 9 * 2 + 2 * 5 + 2 * 2 + 5 * 2
    # A near-exact joint table scores like a resample (the ideal); independent columns lose
    # the correlations and score far worse.
    assert good.synthetic.workload_error < 2 * good.ideal.workload_error
    assert indep.synthetic.workload_error > 3 * good.synthetic.workload_error
    assert indep.copy == 2
    summary = good.as_dict()
    assert summary["dp"] is False
    assert "not differentially private" in summary["note"]


def test_evaluate_is_for_admins_and_rows(evaluated_store):
    with dpsql.connect(evaluated_store, "alice") as alice, pytest.raises(AccessDenied):
        evaluate_release(alice.context(), "good")
    with dpsql.connect(evaluated_store, "admin") as admin:
        admin.release("adult", synthesizer="range", epsilon=1, columns=["age"], name="ages")
        with pytest.raises(ReleaseError, match="dp_range_count"):
            evaluate_release(admin.context(), "ages")
        with pytest.raises(ReleaseError, match="copies 1 to 2"):
            evaluate_release(admin.context(), "indep", copy=3)


def test_report_writes_html_and_figures(evaluated_store, tmp_path):
    with dpsql.connect(evaluated_store, "admin") as admin:
        evaluation = evaluate_release(admin.context(), "good")
    paths = write_report(evaluation, tmp_path / "report")
    for key in ("scatter", "merit", "columns"):
        data = paths[key].read_bytes()
        assert data.startswith(b"\x89PNG")
        assert len(data) > 10_000
    page = paths["html"].read_text()
    assert "Not differentially private" in page
    assert page.count("data:image/png;base64,") == 3
    assert "bootstrap ideal" in page
    assert "workload error" in page


def test_a_failed_evaluation_is_audited_as_failed(evaluated_store, monkeypatch):
    from dpsql.analysis import fidelity

    def broken(*args, **kwargs):
        raise MemoryError("out of memory")

    monkeypatch.setattr(fidelity, "bootstrap_ideal", broken)
    with dpsql.connect(evaluated_store, "admin") as admin:
        with pytest.raises(MemoryError):
            evaluate_release(admin.context(), "good", seed=3)
        audit = admin.audit(last=1)[0]
    assert (audit["action"], audit["outcome"]) == ("evaluate", "failed")
    assert "MemoryError" in audit["reason"]
