"""A release's forecast: computed before the charge from public facts, true to the fit.

It must (1) exist for every synthesizer and read nothing but the domain and the
budget, (2) give the noise the fit then really draws, (3) turn that noise into
an error the samplers really produce, and (4) refuse, before the charge, a
release that cannot beat ``independent`` unless the administrator forces it.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import duckdb
import numpy as np
import pytest
from click.testing import CliRunner

import dpsql
from dpsql import noise
from dpsql.admin.audit import audit
from dpsql.admin.releases import plan_release
from dpsql.domain import Domain
from dpsql.errors import ReleaseError
from dpsql.policies import active_policy
from dpsql.privacy import PrivacyCost
from dpsql.synth import base
from dpsql.synth.catalog import BUILTIN
from dpsql.synth.forecast import Forecast, expected_l1, noise_sd

COLUMNS = {"range": ["age"], "joint": ["age", "sex", "income_50k"]}
OPTIONS = {"modp": {"mode": "dp"}}


def _installed(name: str) -> bool:
    try:
        base.get(name, **OPTIONS.get(name, {}))
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", [d.name for d in BUILTIN])
def test_every_synthesizer_forecasts_from_the_domain_and_budget_alone(
        store_path: Path, name: str) -> None:
    if not _installed(name):
        pytest.skip(f"{name}'s extra is not installed")
    synth = base.get(name, **OPTIONS.get(name, {}))
    assert list(inspect.signature(synth.forecast).parameters) == ["domain", "budget"]
    with dpsql.connect(store_path, "admin") as admin:
        dataset = active_policy(admin.store).dataset("adult")
        cost = admin.context().cost(epsilon=1)
    domain = Domain.from_dataset(dataset, COLUMNS.get(name))
    forecast = synth.forecast(domain, cost)
    assert isinstance(forecast, Forecast)
    assert forecast.planned, "a DP synthesizer plans at least one measurement"
    assert all(p.sd > 0 and p.count >= 1 and p.cells >= 1 for p in forecast.planned)
    assert forecast.lines()
    json.dumps(forecast.as_dict())  # what the provenance keeps
    # More budget, less noise: the forecast follows the budget, not a constant.
    richer = synth.forecast(domain, cost + cost + cost + cost)
    assert all(r.sd < p.sd for r, p in zip(richer.planned, forecast.planned, strict=True))


def test_the_forecast_is_the_noise_the_fit_then_draws(admin: dpsql.Session) -> None:
    """independent's and range's forecast sd equal what their fits record; MODP's multiplier."""
    result = admin.release("adult", synthesizer="independent", name="ind", epsilon=1, seed=1)
    planned = {p["what"]: p for p in result.record["forecast"]["planned"]}
    drawn = {m["noise_sd"] for m in result.record["diagnostics"]["marginals"]}
    assert len(drawn) == 1  # every column gets the same share
    assert drawn.pop() == pytest.approx(planned["1-way marginal of each column"]["sd"],
                                        rel=1e-3)  # the record rounds to 4 digits
    tree = admin.release("adult", synthesizer="range", name="ages", epsilon=1, columns=["age"],
                         seed=1)
    [level] = tree.record["forecast"]["planned"]
    sds = {m.get("noise_sd") or m.get("sd") for m in tree.record["measurements"]
           if m.get("noise_sd") or m.get("sd")}
    if sds:
        assert all(math.isclose(s, level["sd"], rel_tol=1e-3) for s in sds)
    assert level["count"] == len(tree.record["measurements"])


@pytest.mark.parametrize(("mechanism", "parameter"), [("gaussian", 53.29), ("laplace", 7.5)])
def test_expected_l1_is_what_the_samplers_draw(mechanism: str, parameter: float) -> None:
    """Mean |noise| of 400,000 draws of dpsql's own samplers against expected_l1.

    Its relative standard error is under 0.2%, so a 1% tolerance fails by chance
    with probability below 1e-6; a scale 5% off (a wrong formula) fails.
    """
    cells = 400_000
    if mechanism == "gaussian":
        draws = noise.discrete_gaussian(parameter, cells)
        sd, name = math.sqrt(parameter), "discrete_gaussian"
    else:
        draws = noise.discrete_laplace(parameter, cells)
        sd, name = math.sqrt(2) * parameter, "discrete_laplace"
    observed = float(np.abs(draws).mean())
    forecast = expected_l1(sd, name, cells) / cells
    assert observed == pytest.approx(forecast, rel=0.01)
    assert observed != pytest.approx(expected_l1(1.05 * sd, name, cells) / cells, rel=0.01)


def test_noise_sd_is_the_calibration_of_the_samplers() -> None:
    sd, name = noise_sd(PrivacyCost.zcdp("0.5"), 1)  # sigma^2 = 1 / (2 rho) = 1
    assert name == "discrete_gaussian"
    assert sd == pytest.approx(1.0, rel=1e-3)
    sd, name = noise_sd(PrivacyCost.pure(2), 3)  # Laplace scale 3 / 2, sd sqrt(2) * 1.5
    assert name == "discrete_laplace"
    assert sd == pytest.approx(math.sqrt(2) * 1.5, rel=1e-3)
    assert noise_sd(PrivacyCost.unbounded("zcdp"), 1) == (0.0, "none")


TINY = """version: 1
accounting: zcdp
delta: 1.0e-6
datasets:
  t:
    table: t
    public_row_count: 60
    budget: {epsilon: 20}
    synthesizers: [independent, modp]
    columns:
      a: {type: categorical, values: [0, 1, 2, 3]}
      b: {type: integer, bounds: [0, 99], bins: 10}
      c: {type: categorical, values: [0, 1]}
users:
  admin: {role: admin, budgets: {t: {epsilon: 20}}}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """60 public rows: DP-SGD at epsilon 1 is mostly noise there."""
    rows = tmp_path / "t.parquet"
    duckdb.connect().execute(f"COPY (SELECT i % 4 AS a, (i * 7) % 100 AS b, i % 2 AS c "
                             f"FROM range(60) r(i)) TO '{rows}'")
    policy = tmp_path / "tiny.yaml"
    policy.write_text(TINY)
    path = tmp_path / "tiny.duckdb"
    dpsql.init(path, policy, {"t": rows})[0].close()
    return path


def test_a_release_that_cannot_beat_independent_is_refused_before_the_charge(tiny: Path
                                                                               ) -> None:
    with dpsql.connect(tiny, "admin") as admin:
        before = admin.ledger.budget("admin", "t").remaining
        entries = len(audit(admin, user="admin").entries)
        with pytest.raises(ReleaseError, match=r"cannot beat independent.*--force"):
            admin.release("t", synthesizer="modp", name="m", epsilon=1,
                          options={"mode": "dp", "steps": 5})
        assert admin.ledger.budget("admin", "t").remaining == before  # nothing charged
        [last] = audit(admin, user="admin", last=1).entries
        assert last.outcome == "refused"
        assert "cannot beat independent" in last.reason
        assert len(audit(admin, user="admin").entries) == entries + 1
        # The dry run says the same, and charges and audits nothing.
        plan = plan_release(admin, dataset="t", synthesizer="modp", name="m", epsilon=1,
                            options={"mode": "dp", "steps": "5"})
        assert "cannot beat independent" in plan.refused
        assert plan.forecast.worse
        assert any("DP-SGD" in line for line in plan.forecast.lines())
        assert admin.ledger.budget("admin", "t").remaining == before
        assert len(audit(admin, user="admin").entries) == entries + 1
        # Forced, it is charged and released (published, or held by its checks).
        forced = admin.release("t", synthesizer="modp", name="m", epsilon=1, force=True,
                               options={"mode": "dp", "steps": 5})
        assert forced.record["forecast"]["worse_than_independent"]
        assert admin.ledger.budget("admin", "t").remaining < before
        forced_row = next(e for e in audit(admin, user="admin").entries
                          if e.action == "release" and e.outcome != "refused")
        assert forced_row.statement.endswith("--force")  # the audit says it was forced
        # independent itself is never refused by its own yardstick.
        admin.release("t", synthesizer="independent", name="i", epsilon=1)


def test_a_collapsed_dp_modp_fit_is_kept_unpublished(admin: dpsql.Session) -> None:
    """A step size no training survives (lr=5): the drawn rows leave the seed marginals."""
    pytest.importorskip("torch")
    result = admin.release("adult", synthesizer="modp", name="collapsed", epsilon=2,
                           columns=["age", "sex", "race", "income_50k", "relationship"],
                           options={"mode": "dp", "lr": 5, "steps": 10})
    [check] = result.record["diagnostics"]["checks"]
    assert check["check"] == "sample keeps the seed marginals"
    assert check["passed"] is False
    assert result.held
    assert result.record["published"] is False


def test_a_healthy_dp_modp_fit_passes_its_check(admin: dpsql.Session) -> None:
    pytest.importorskip("torch")
    result = admin.release("adult", synthesizer="modp", name="healthy", epsilon=8,
                           columns=["age", "sex", "race", "income_50k", "relationship"],
                           options={"mode": "dp", "steps": 30})
    [check] = result.record["diagnostics"]["checks"]
    assert check["passed"] is True, check
    assert check["value"] < check["limit"]
    assert not result.held


def test_the_cli_dry_run_prints_the_forecast_and_charges_nothing(store_path: Path) -> None:
    from dpsql.cli import _load_commands, cli

    _load_commands()
    runner = CliRunner()
    args = ["release", "adult", "--synth", "independent", "--epsilon", "1", "--name", "x",
            "--db", str(store_path), "--dry-run"]
    shown = runner.invoke(cli, args)
    assert shown.exit_code == 0, shown.output
    assert "dry run: release adult by independent as x" in shown.output
    assert "nothing was charged" in shown.output
    assert "1-way marginal of each column" in shown.output
    as_json = runner.invoke(cli, [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    assert data["forecast"]["planned"][0]["mechanism"] == "discrete_gaussian"
    assert data["refused"] is None
    with dpsql.connect(store_path, "admin") as admin:
        assert admin.ledger.budget("admin", "adult").spent.is_zero
    released = runner.invoke(cli, args[:-1])
    assert released.exit_code == 0, released.output
    assert "forecast: 13 x 1-way marginal of each column" in released.output


def test_the_console_form_dry_runs_and_forces(store_path: Path) -> None:
    from dpsql.console.actions import action, perform

    form = {"dataset": "adult", "synthesizer": "independent", "epsilon": "1", "name": "c"}
    planned = action("/release", {**form, "dry_run": "1"})
    assert planned is not None
    assert planned.back == "releases"
    assert planned.line[-3:] == ("--dry-run", "--", "adult")
    with dpsql.connect(store_path, "admin") as admin:
        said = perform(admin, planned)
        assert "dry run: release adult by independent as c" in said
        assert "1-way marginal of each column" in said
        assert admin.ledger.budget("admin", "adult").spent.is_zero
        forced = action("/release", {**form, "force": "on"})
        assert forced is not None
        assert "--force" in forced.line
        said = perform(admin, forced)
        assert "forecast: 13 x 1-way marginal" in said
        assert "charged and queued" in said


def test_a_forecast_that_breaks_is_a_refusal_before_the_charge(admin: dpsql.Session,
                                                               monkeypatch) -> None:
    """A synthesizer's forecast is plugin code: its bug refuses the release, audited, free."""
    from dpsql.errors import ConfigurationError
    from dpsql.synth.histogram import Independent

    monkeypatch.setattr(Independent, "forecast", lambda self, domain, budget: 1 / 0)
    with pytest.raises(ConfigurationError, match=r"could not forecast.*ZeroDivisionError"):
        admin.release("adult", synthesizer="independent", name="broken", epsilon=1)
    assert admin.ledger.budget("admin", "adult").spent.is_zero
    [last] = audit(admin, user="admin", last=1).entries
    assert last.outcome == "refused"


def test_the_dry_run_says_when_the_budget_left_is_short(admin: dpsql.Session) -> None:
    left = admin.ledger.budget("admin", "adult").remaining
    short = plan_release(admin, dataset="adult", synthesizer="independent", name="big",
                         epsilon=9.5)
    assert "more than the" in short.refused
    assert cost_text(left) in short.refused
    fits = plan_release(admin, dataset="adult", synthesizer="independent", name="small",
                        epsilon=1)
    assert fits.refused == ""


def cost_text(cost: PrivacyCost) -> str:
    return cost.describe(1e-6, "down")


def test_dp_sgd_noise_grows_with_the_rows_a_unit_may_add(tiny: Path) -> None:
    """The step noise is the multiplier times the sensitivity: max_rows rows' gradients."""
    import dataclasses

    with dpsql.connect(tiny, "admin") as admin:
        dataset = active_policy(admin.store).dataset("t")
        cost = admin.context().cost(epsilon=4)
    domain = Domain.from_dataset(dataset, None)
    modp = base.get("modp", mode="dp")

    def ratio(d: Domain) -> float:
        line = next(x for x in modp.forecast(d, cost).lines() if x.startswith("each DP-SGD"))
        return float(line.split("noise is ")[1].split("x")[0])

    assert ratio(dataclasses.replace(domain, max_rows=3)) == pytest.approx(
        3 * ratio(domain), rel=0.02)


def test_modp_refuses_a_diagnostic_draw_no_machine_holds() -> None:
    from dpsql.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="diagnostic_rows must be at most"):
        base.get("modp", mode="dp", diagnostic_rows=10**9)


def test_a_budget_too_small_for_dp_sgd_is_refused_before_the_charge(tiny: Path) -> None:
    """It used to be charged, then fail in the worker (the sampler's largest sigma)."""
    from dpsql.errors import ConfigurationError

    with dpsql.connect(tiny, "admin") as admin:
        before = admin.ledger.budget("admin", "t").remaining
        with pytest.raises(ConfigurationError, match=r"too small|exceeds"):
            admin.release("t", synthesizer="modp", name="m", rho="1e-15", force=True,
                          options={"mode": "dp", "steps": 5})
        assert admin.ledger.budget("admin", "t").remaining == before
        [last] = audit(admin, user="admin", last=1).entries
        assert last.outcome == "refused"
