"""NAPSU-MQ through the Synthesizer protocol on a real store."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpsql
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.errors import ConfigurationError
from dpsql.policies import active_policy
from dpsql.privacy import PrivacyCost
from dpsql.synth import FittedSynthesizer, Resumable, Synthesizer, get, spanning
from dpsql.synth.measure import count_marginals
from dpsql.synth.napsu_mq import DiagnosticsWarning, NapsuMQ, mst
from dpsql.synth.napsu_mq import posterior as post
from dpsql.synth.napsu_mq.model import compiled_marginals
from dpsql.synth.napsu_mq.structure import Structure
from dpsql.synth.napsu_mq.synthesizer import FittedNapsuMQ
from tests.conftest import ADULT_SAMPLE
from tests.napsu_mq.conftest import POLICY, Source, build

FAST = {"inference": "laplace", "laplace_iterations": "3000"}
# The Adult sample has near-empty cells (age 68-84 with rare categories): Laplace fits
# rightly warn that those parameters are barely bound by the data.
weak_cells = pytest.mark.filterwarnings("ignore::dpsql.synth.napsu_mq.DiagnosticsWarning")




def test_registered_and_options_are_converted() -> None:
    synth = get("napsu_mq", cliques="age+sex,race+sex", chains="2", select="none",
                select_share="0.3", inference="laplace")
    assert isinstance(synth, Synthesizer)
    assert isinstance(synth, NapsuMQ)
    assert synth.cliques == (("age", "sex"), ("race", "sex"))
    assert synth.chains == 2
    assert synth.select_share == 0.3


@pytest.mark.parametrize(("option", "value"), [
    pytest.param("select", "greedy", id="select"),
    pytest.param("inference", "vi", id="inference"),
    pytest.param("select_share", "1.5", id="share"),
    pytest.param("chains", "0", id="chains"),
    pytest.param("covariance", "diagonal", id="covariance"),
    pytest.param("pilot_samples", "0", id="jumps-without-pilot"),  # the default jumps need one
    pytest.param("moves", "0", id="moves"),
    pytest.param("sampling", "stratified", id="sampling"),
])
def test_bad_options_are_refused(option: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match="napsu_mq"):
        get("napsu_mq", **{option: value})


def test_pure_policy_is_refused(tmp_path: Path) -> None:
    store = build(tmp_path, "pure")
    dataset = active_policy(store).datasets["adult"]
    with pytest.raises(ConfigurationError, match="zcdp"):
        get("napsu_mq", **FAST).fit(bounded_relation(store, dataset),
                                    Domain.from_dataset(dataset), PrivacyCost.pure(1),
                                    np.random.default_rng(0))
    store.close()


def test_unknown_clique_column_is_refused(adult: Source) -> None:
    with pytest.raises(ConfigurationError, match=r"clique 'agee\+sex' uses 'agee', which is "
                                                 r"not among the released columns .*did you "
                                                 r"mean 'age'"):
        get("napsu_mq", cliques="agee+sex", **FAST).fit(
            adult.relation, adult.domain, PrivacyCost.zcdp(1), np.random.default_rng(0))


@weak_cells
def test_spent_equals_the_budget_at_the_boundary(adult: Source) -> None:
    budget = PrivacyCost.zcdp("0.5")
    fitted = get("napsu_mq", cliques="hours_per_week+age,race+sex", **FAST).fit(
        adult.relation, adult.domain, budget, np.random.default_rng(1))
    assert isinstance(fitted, FittedSynthesizer)
    assert fitted.spent <= budget
    # Parts round down to the 1e-18 quantum and the selection epsilon to a 2**-40 grid.
    assert float(budget.value - fitted.spent.value) < 1e-9
    info = fitted.describe()
    d = len(info["model"]["cliques"])
    rho_measure = Fraction("0.5") * Fraction(8, 10)
    for m in info["measurements"]:  # each clique's sigma^2 = d / (2 rho_measure), rounded up
        assert m["scale"] ** 2 >= d / (2 * float(rho_measure))
        assert m["scale"] ** 2 == pytest.approx(d / (2 * float(rho_measure)), rel=1e-5)
    selection = info["selection"]
    # Required cliques join {hours, age} and {race, sex}; income is alone: 2 rounds.
    assert len(selection["pairs"]) == 2
    assert json.dumps(info)  # JSON-able


def test_exact_fit_with_an_infinite_budget_matches_the_counts(adult: Source) -> None:
    cliques = [("hours_per_week", "age"), ("race", "sex"), ("age", "income_50k")]
    with warnings.catch_warnings():  # zero counts leave logits to the prior: it may warn
        warnings.simplefilter("ignore", DiagnosticsWarning)
        fitted = get("napsu_mq", cliques="hours_per_week+age,race+sex,age+income_50k",
                     select="none", **FAST).fit(adult.relation, adult.domain,
                                                PrivacyCost.unbounded("zcdp"),
                                                np.random.default_rng(2))
    exact = count_marginals(adult.relation, adult.domain, cliques)
    assert fitted.rows == int(sum(exact[0].reshape(-1)))
    # The posterior mean reproduces every measured marginal within the posterior's spread:
    # the mode is O(1) counts from exact moment matching (the CLT likelihood's
    # log-determinant term), and the mean of the importance-resampled Laplace draws is
    # within a few posterior sds (about sqrt(count) a cell) of the mode; a wrong fit is off
    # by hundreds. A zero count leaves its logit to the prior, so compare probabilities.
    mean, _ = fitted.posterior.summary()
    with jax.enable_x64(True):
        tables = compiled_marginals(fitted.structure)(jnp.asarray(mean[: fitted.structure.dim]))
    names = adult.domain.names
    for clique, counts in zip(cliques, exact, strict=True):
        index = sorted(names.index(c) for c in clique)
        tree = next(i for i, c in enumerate(fitted.structure.tree) if set(index) <= set(c))
        clique_cols = fitted.structure.tree[tree]
        table = np.asarray(tables[tree])
        away = tuple(a for a, j in enumerate(clique_cols) if j not in index)
        got = table.sum(axis=away)
        if [names[j] for j in index] != list(clique):
            got = got.T
        assert (np.abs(got * fitted.rows - counts) <= 4 + 3 * np.sqrt(counts)).all(), clique


@weak_cells
def test_state_restores_and_samples_more_copies(adult: Source) -> None:
    fitted = get("napsu_mq", cliques="hours_per_week+age", **FAST).fit(
        adult.relation, adult.domain, PrivacyCost.zcdp(1), np.random.default_rng(4))
    assert isinstance(fitted, Resumable)
    state = json.loads(json.dumps(fitted.state()))
    again = NapsuMQ.restore(state, adult.domain)
    assert again.rows == fitted.rows
    assert again.spent.is_zero
    copy = again.sample(1000, np.random.default_rng(5))
    assert copy.column_names == list(adult.domain.names)
    assert copy.num_rows == 1000
    for name, size in zip(adult.domain.names, adult.domain.shape, strict=True):
        values = copy.column(name).to_numpy()
        assert values.min() >= 0
        assert values.max() < size
    # The same generator gives the same copy from the original and the restored model.
    a = fitted.sample(500, np.random.default_rng(6))
    b = again.sample(500, np.random.default_rng(6))
    assert a.equals(b)


def test_a_predictive_copy_spreads_its_rows_over_many_posterior_draws() -> None:
    # Two posterior draws: one puts (almost) every row in cell 1, the other in cell 0.
    # A default copy follows one draw; a predictive copy about half each (its 100
    # parts pick a draw each: 50 +- 5 of them are draw 0; 5.5 sds is ~4e-8 two-sided).
    structure = Structure.build((2,), [(0,)])
    fitted = FittedNapsuMQ(structure, ("x",), post.Samples(np.array([[30.0], [-30.0]])),
                           PrivacyCost.zero("zcdp"), {}, 1000)
    rng = np.random.default_rng(3)
    ones = [fitted.sample(10_000, rng).column("x").to_numpy().mean() for _ in range(5)]
    assert all(share in (0.0, 1.0) for share in ones)
    predictive = replace(fitted, sampling="predictive")
    copy = predictive.sample(10_000, rng).column("x").to_numpy()
    assert copy.size == 10_000
    assert abs(copy.mean() - 0.5) < 0.5 * 5.5 / np.sqrt(100)
    assert 0 < copy[:5000].mean() < 1  # the parts are shuffled together
    again = replace(fitted, sampling="predictive").sample(777, np.random.default_rng(4))
    assert again.equals(predictive.sample(777, np.random.default_rng(4)))
    assert again.num_rows == 777
    assert predictive.sample(0, rng).num_rows == 0


@weak_cells
def test_rounded_sampling_is_kept_by_the_state_and_warns(adult: Source) -> None:
    fitted = get("napsu_mq", cliques="race+sex", select="none", sampling="rounded",
                 **FAST).fit(adult.relation, adult.domain, PrivacyCost.zcdp(1),
                             np.random.default_rng(4))
    assert any("Rubin" in w for w in fitted.describe()["diagnostics"]["warnings"])
    state = json.loads(json.dumps(fitted.state()))
    again = NapsuMQ.restore(state, adult.domain)
    assert (fitted.sampling, again.sampling) == ("rounded", "rounded")
    assert fitted.describe()["parameters"]["sampling"] == "rounded"
    del state["describe"]["parameters"]["sampling"]  # written before the option existed
    assert NapsuMQ.restore(state, adult.domain).sampling == "random"
    state["describe"]["parameters"]["sampling"] = "stratified"
    with pytest.raises(ConfigurationError, match="sampling"):
        NapsuMQ.restore(state, adult.domain)
    assert fitted.sample(700, np.random.default_rng(6)).equals(
        again.sample(700, np.random.default_rng(6)))


def test_restore_refuses_a_changed_domain(adult: Source) -> None:
    fitted = get("napsu_mq", cliques="race+sex", select="none", **FAST).fit(
        adult.relation, adult.domain, PrivacyCost.zcdp(1), np.random.default_rng(7))
    smaller = adult.domain.project(list(adult.domain.names)[:-1])
    with pytest.raises(ConfigurationError, match="domain changed"):
        NapsuMQ.restore(fitted.state(), smaller)


def test_mst_selection_builds_a_spanning_tree(adult: Source) -> None:
    names = list(adult.domain.names)
    selection = mst.select(adult.relation, adult.domain, [("race", "sex")],
                           PrivacyCost.zcdp("0.05"), PrivacyCost.zcdp("0.05"))
    assert len(selection.pairs) == len(names) - 2
    groups = spanning.components(names, [("race", "sex"), *selection.pairs])
    assert len(set(groups.values())) == 1
    assert selection.spent <= PrivacyCost.zcdp("0.1")
    assert len(selection.oneway) == len(names)
    record = selection.describe()
    assert [r["pair"] for r in record["rounds"]] == [list(p) for p in selection.pairs]


def test_mst_with_a_huge_budget_picks_the_worst_predicted_pair(adult: Source) -> None:
    names = list(adult.domain.names)
    selection = mst.select(adult.relation, adult.domain, [], PrivacyCost.zcdp(10**6),
                           PrivacyCost.zcdp(10**6))
    probs, rows = mst.independent_prediction(selection.oneway)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    exact = count_marginals(adult.relation, adult.domain, pairs)
    scores = [np.abs(c - np.rint(rows * np.outer(probs[a], probs[b]))).sum()
              for (a, b), c in zip(pairs, exact, strict=True)]
    assert selection.pairs[0] == pairs[int(np.argmax(scores))]


def test_mst_adds_no_pair_beyond_its_room(adult: Source) -> None:
    """Room for 5 parameters: a spanning tree of the 5 columns needs at least 13, so MST stops.

    Pairs add (k_a - 1)(k_b - 1): sex x income 1, a 5-valued column with a binary
    one 4, two 5-valued columns 16; at most two pairs fit.
    """
    sizes = dict(zip(adult.domain.names, adult.domain.shape, strict=True))
    selection = mst.select(adult.relation, adult.domain, [], PrivacyCost.zcdp("0.05"),
                           PrivacyCost.zcdp("0.05"), room=5)
    added = sum((sizes[a] - 1) * (sizes[b] - 1) for a, b in selection.pairs)
    assert 1 <= added <= 5
    assert selection.stopped.startswith(f"after {len(selection.pairs)} of 4 rounds")
    assert len(selection.rounds) == len(selection.pairs)
    assert selection.spent < PrivacyCost.zcdp("0.1")  # the unplayed rounds are not spent


@weak_cells
def test_estimate_bounds_the_selected_model_and_names_the_limit(adult: Source) -> None:
    """The pre-charge estimate caps MST's model; a base beyond a limit is refused by name."""
    synth = get("napsu_mq", **FAST, max_parameters="20")
    found = synth.estimate(adult.domain)
    assert found.parameters == 20
    fitted = synth.fit(adult.relation, adult.domain, PrivacyCost.zcdp("0.5"),
                       np.random.default_rng(0))
    described = fitted.describe()
    assert described["model"]["parameters"] <= 20
    assert described["estimate"]["parameters"] == 20
    for option, value in [("max_parameters", "10"), ("max_memory_mb", "0.01"),
                          ("max_minutes", "1e-7")]:
        with pytest.raises(ConfigurationError, match=f"option {option}"):
            get("napsu_mq", **FAST, **{option: value}).check(adult.domain,
                                                              PrivacyCost.zcdp("0.5"))


def test_a_refused_release_charges_nothing(tmp_path: Path) -> None:
    """The limits are checked before the ledger charges: a refusal leaves every budget as it was."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(accounting="zcdp", delta="delta: 1.0e-6\n").replace(
        "    table: adult\n", "    table: adult\n    synthesizers: [napsu_mq]\n"))
    dpsql.init(tmp_path / "store.duckdb", policy, {"adult": ADULT_SAMPLE})[0].close()
    with dpsql.connect(tmp_path / "store.duckdb", "admin") as admin:
        before = [(b.dataset, b.spent) for b in admin.budget()]
        with pytest.raises(ConfigurationError, match="option max_parameters"):
            admin.release("adult", synthesizer="napsu_mq", name="refused", epsilon=0.5,
                          cliques="age+race+hours_per_week", max_parameters=20)
        assert [(b.dataset, b.spent) for b in admin.budget()] == before
        assert not admin.store.cursor().sql(
            "SELECT * FROM information_schema.tables WHERE table_schema = 'released'").fetchall()
