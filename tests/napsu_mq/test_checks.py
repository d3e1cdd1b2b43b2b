"""NAPSU-MQ's failure checks: a collapsed or misfit model fails, a good one passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dpsql
from dpsql.synth.napsu_mq import checks
from dpsql.synth.napsu_mq import posterior as post
from dpsql.synth.napsu_mq.evidence import Observed
from dpsql.synth.napsu_mq.structure import Structure
from tests.conftest import ADULT_SAMPLE
from tests.napsu_mq.conftest import POLICY

SIZES = (3, 4)


def uniform_model() -> tuple[Structure, post.Posterior]:
    """theta = 0: every cell of the 3 x 4 domain equally likely, in every draw."""
    structure = Structure.build(SIZES, [[0, 1]])
    dim = structure.dim
    return structure, post.Gaussian(np.zeros(dim), np.eye(dim) * 1e-12)


def test_a_model_that_matches_its_measurement_passes() -> None:
    structure, posterior = uniform_model()
    spread = np.full(SIZES, 100.0)  # 1,200 rows spread evenly, measured with little noise
    worst = checks.measurement_fit(structure, posterior, [Observed((0, 1), spread, 1.0)])
    assert worst["gap"] < 1e-6
    assert checks.fit_check(worst, ["a", "b"])["passed"]


def test_a_collapsed_measurement_against_a_spread_model_fails() -> None:
    """The failure the check exists for: the table and the measurements disagree."""
    structure, posterior = uniform_model()
    collapsed = np.zeros(SIZES)
    collapsed[0, 0] = 1200.0
    worst = checks.measurement_fit(structure, posterior, [Observed((0, 1), collapsed, 1.0)])
    assert worst["gap"] == pytest.approx(1 - 1 / 12, abs=1e-4)
    assert worst["columns"] == [0, 1]
    check = checks.fit_check(worst, ["a", "b"])
    assert not check["passed"]
    assert "a+b" in check["meaning"]


def test_the_limit_follows_the_noise_and_the_axis_order_of_the_measurement() -> None:
    structure, posterior = uniform_model()
    # a 1-way measurement of column 1 only, with noise sd 100 per cell over 400 rows: noise
    # alone moves it by 0.5 * 4 * 100 * sqrt(2 / pi) / 400 = 0.399 on average
    skewed = np.array([250.0, 50.0, 50.0, 50.0])
    worst = checks.measurement_fit(structure, posterior, [Observed((1,), skewed, 100.0**2)])
    noise = 0.5 * 4 * 100 * np.sqrt(2 / np.pi) / 400
    assert worst["limit"] == pytest.approx(checks.NOISE_TV_FACTOR * noise, rel=1e-3)
    assert worst["gap"] == pytest.approx(0.5 * (abs(250 / 400 - 0.25) + 3 * 0.125), abs=1e-4)
    assert checks.fit_check(worst, ["a", "b"])["passed"]  # within what the noise explains
    # the same numbers as a 2-way measurement given as (1, 0): transposed, still uniform
    spread = np.full((4, 3), 50.0)
    worst = checks.measurement_fit(structure, posterior, [Observed((1, 0), spread, 1.0)])
    assert worst["gap"] < 1e-6


def test_inference_checks_fail_on_one_draw_and_on_disagreeing_chains() -> None:
    laplace = {"converged": True, "iterations": 10, "importance_ess": 1.0}
    failed = [c["check"] for c in checks.checks({"laplace": laplace}) if not c["passed"]]
    assert failed == ["importance-sampling ESS"]
    nuts = {"max_rhat": 1.3, "divergences": 1, "iterations": 1000}
    failed = [c["check"] for c in checks.checks({"laplace": {**laplace, "importance_ess": None},
                                                  "nuts": nuts}) if not c["passed"]]
    assert failed == ["NUTS max R-hat"]
    one_chain = {"max_rhat": None, "divergences": 100, "iterations": 1000}
    failed = [c["check"] for c in checks.checks({"laplace": {**laplace, "converged": False,
                                                              "importance_ess": None},
                                                  "nuts": one_chain}) if not c["passed"]]
    assert failed == ["laplace optimizer converged", "NUTS divergent share"]


def test_a_laplace_fit_of_a_sparse_clique_is_held_from_analysts(tmp_path: Path) -> None:
    """The reported case in small: a 3-way clique of 125 cells at epsilon 0.05, Laplace.

    Its Gaussian fits the posterior so poorly that one importance draw takes all the
    weight (ESS 1.0 in every run tried), so the release is kept unpublished.
    """
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(accounting="zcdp", delta="delta: 1.0e-6\n").replace(
        "    table: adult\n", "    table: adult\n    synthesizers: [napsu_mq]\n"))
    dpsql.init(tmp_path / "store.duckdb", policy, {"adult": ADULT_SAMPLE})[0].close()
    with dpsql.connect(tmp_path / "store.duckdb", "admin") as admin:
        result = admin.release("adult", synthesizer="napsu_mq", name="sparse", epsilon=0.05,
                               seed=1, inference="laplace", laplace_iterations=3000,
                               cliques="age+race+hours_per_week")
        diagnostics = result.record["diagnostics"]
        failed = [c["check"] for c in diagnostics["checks"] if not c["passed"]]
        assert "importance-sampling ESS" in failed
        assert diagnostics["converged"] is False
        assert result.table == "held.sparse"
        assert admin.audit("admin", last=1)[0]["outcome"] == "held"
