"""The ``modp`` synthesizer through the protocol, on a real store (the bundled Adult sample)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import dp_accounting
import duckdb
import numpy as np
import pytest
from dp_accounting import rdp

import dpsql
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.errors import ConfigurationError
from dpsql.privacy import PrivacyCost
from dpsql.synth import FittedSynthesizer, Synthesizer, get
from dpsql.synth.modp.accounting import FLOAT_MARGIN
from dpsql.synth.modp.synthesizer import read_codes

FAST = {"blades": "2", "reduced_features": "6", "epochs": "6", "warmup_epochs": "2",
        "batch_size": "500", "diagnostic_rows": "200"}


@pytest.fixture
def source(store_path: Path) -> Iterator[tuple[duckdb.DuckDBPyRelation, Domain]]:
    with dpsql.connect(store_path, "admin") as session:
        dataset = session.policy.dataset("adult")
        yield bounded_relation(session.store, dataset), Domain.from_dataset(dataset)


def _codes(table: object, domain: Domain) -> np.ndarray:
    return np.stack([table.column(n).to_numpy() for n in domain.names], axis=1)  # type: ignore[attr-defined]


def _pair_error(a: np.ndarray, b: np.ndarray, domain: Domain) -> float:
    """Mean over column pairs of half the L1 distance between normalized 2-way tables."""
    errors = []
    for i in range(len(domain)):
        for j in range(i + 1, len(domain)):
            cells = domain.shape[i] * domain.shape[j]
            ta = np.bincount(a[:, i] * domain.shape[j] + a[:, j], minlength=cells) / len(a)
            tb = np.bincount(b[:, i] * domain.shape[j] + b[:, j], minlength=cells) / len(b)
            errors.append(0.5 * np.abs(ta - tb).sum())
    return float(np.mean(errors))


def test_registered_with_options_from_strings() -> None:
    synth = get("modp", mode="dp", blades="2", sampling_rate="0.5", lr="none")
    assert isinstance(synth, Synthesizer)
    assert synth.is_dp
    assert synth.name == "modp"
    assert get("modp").is_dp is False
    assert synth.blades == 2
    assert synth.sampling_rate == 0.5
    assert synth.lr is None
    assert type(synth).privacy_lowering_options == ("passthrough",)
    assert type(synth).is_dp is False  # read before configuring: assume not DP
    with pytest.raises(ConfigurationError, match="follows its mode"):
        synth.is_dp = False  # type: ignore[misc]


@pytest.mark.parametrize(("options", "match"), [
    ({"mode": "exact"}, "mode must be one of"),
    ({"passthrough": "1.5"}, "passthrough"),
    ({"mode": "dp", "passthrough": "0.2"}, "not DP"),
    ({"mode": "dp", "structural_zeros": "true"}, "not DP"),
    ({"seed_share": "0"}, "seed_share"),
    ({"blades": "0"}, "blades"),
    ({"sampling_rate": "1.5"}, "sampling_rate"),
    ({"device": "tpu"}, "device"),
    ({"blade": "2"}, "did you mean 'blades'"),
], ids=["mode", "passthrough", "dp_passthrough", "dp_zeros", "seed_share", "blades",
        "sampling_rate", "device", "typo"])
def test_bad_options_are_refused(options: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        get("modp", **options)


def test_empirical_fit_sample_and_diagnostics(source: tuple[duckdb.DuckDBPyRelation, Domain]
                                              ) -> None:
    relation, domain = source
    stages: list[str] = []
    fitted = get("modp", **FAST).fit(relation, domain, PrivacyCost.zcdp(1),
                                     np.random.default_rng(0),
                                     lambda s, d, t=None: stages.append(s))
    assert isinstance(fitted, FittedSynthesizer)
    assert fitted.spent == PrivacyCost.zero("zcdp")
    assert fitted.rows == 5000
    assert any("z-loss" in s for s in stages)
    assert any("mse" in s for s in stages)
    table = fitted.sample(5000, np.random.default_rng(1))
    assert table.column_names == list(domain.names)
    assert table.num_rows == 5000
    codes = _codes(table, domain)
    assert np.all((codes >= 0) & (codes < np.array(domain.shape)))
    described = fitted.describe()
    json.dumps(described)
    assert described["parameters"]["mode"] == "empirical"
    assert described["measurements"] == []
    diag = described["diagnostics"]
    assert diag["entropy_bits"]["count"] == 5000
    assert diag["hamming_rank"]["rows"] == 200
    assert 0 <= diag["hamming_rank"]["fraction_nearest"] <= diag["hamming_rank"][
        "fraction_within_10"] <= 1
    # it learned the associations: closer 2-way tables than independent columns
    true = read_codes(relation, domain)
    rng = np.random.default_rng(2)
    independent = np.stack([rng.permutation(true[:, j]) for j in range(len(domain))], axis=1)
    assert _pair_error(codes, true, domain) < 0.8 * _pair_error(independent, true, domain)


def test_sampling_is_reproducible(source: tuple[duckdb.DuckDBPyRelation, Domain]) -> None:
    relation, domain = source
    fitted = get("modp", **FAST).fit(relation, domain, PrivacyCost.zcdp(1),
                                     np.random.default_rng(0))
    first = fitted.sample(50, np.random.default_rng(9))
    assert first.equals(fitted.sample(50, np.random.default_rng(9)))
    assert not first.equals(fitted.sample(50, np.random.default_rng(10)))


def test_passthrough_lowers_privacy_visibly(source: tuple[duckdb.DuckDBPyRelation, Domain]
                                            ) -> None:
    relation, domain = source
    plain = get("modp", **FAST).fit(relation, domain, PrivacyCost.zcdp(1),
                                    np.random.default_rng(0)).describe()["diagnostics"]
    copied = get("modp", **FAST, passthrough="0.95").fit(
        relation, domain, PrivacyCost.zcdp(1), np.random.default_rng(0)).describe()["diagnostics"]
    assert copied["entropy_bits"]["mean"] < plain["entropy_bits"]["mean"] / 2
    assert copied["hamming_rank"]["fraction_nearest"] > 0.5
    assert plain["hamming_rank"]["fraction_nearest"] < 0.2


def test_structural_zeros_are_never_filled(source: tuple[duckdb.DuckDBPyRelation, Domain]
                                           ) -> None:
    relation, domain = source
    fitted = get("modp", **FAST, structural_zeros="true").fit(
        relation, domain, PrivacyCost.zcdp(1), np.random.default_rng(0))
    assert fitted.describe()["diagnostics"]["structural_zero_rows"] > 0  # there was work to do
    true = read_codes(relation, domain)
    codes = _codes(fitted.sample(3000, np.random.default_rng(3)), domain)
    found = 0
    for i in range(len(domain)):
        for j in range(i + 1, len(domain)):
            a, b = domain.shape[i], domain.shape[j]
            cells = np.bincount(true[:, i] * b + true[:, j], minlength=a * b).reshape(a, b)
            expected = np.outer(cells.sum(axis=1), cells.sum(axis=0)) / len(true)
            impossible = (cells == 0) & (expected >= 5)  # empty, though independence fills it
            found += int(impossible.sum())
            assert not impossible[codes[:, i], codes[:, j]].any(), (domain.names[i],
                                                                    domain.names[j])
    assert found > 0


def test_two_instance_switches_the_requested_share(
        source: tuple[duckdb.DuckDBPyRelation, Domain]) -> None:
    relation, domain = source
    fitted = get("modp", **FAST, two_instance="0.25").fit(
        relation, domain, PrivacyCost.zcdp(1), np.random.default_rng(0))
    assert fitted.describe()["diagnostics"]["two_instance_switched"] == pytest.approx(0.25,
                                                                                      abs=0.02)
    assert fitted.sample(100, np.random.default_rng(1)).num_rows == 100


def _library_rho(multiplier: float, steps: int) -> float:
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(multiplier), steps))
    return float(np.max(np.asarray(accountant._rdp) / np.asarray(accountant._orders)))


@pytest.mark.parametrize("rate", ["1", "0.3"], ids=["full_batch", "poisson"])
def test_dp_cost_is_the_accountants_and_fits_the_budget(
        source: tuple[duckdb.DuckDBPyRelation, Domain], rate: str) -> None:
    relation, domain = source
    budget = PrivacyCost.zcdp("0.05")
    synth = get("modp", mode="dp", blades="2", reduced_features="4", steps="15",
                sampling_rate=rate, seed_share="0.2")
    fitted = synth.fit(relation, domain, budget, np.random.default_rng(0))
    described = fitted.describe()
    json.dumps(described)
    record = described["parameters"]["dpsgd"]
    seeds = PrivacyCost.zcdp(described["parameters"]["seeds"]["spent"]["rho"])
    measured = sum((PrivacyCost.zcdp(m["cost"]["rho"]) for m in described["measurements"]),
                   PrivacyCost.zero("zcdp"))
    assert measured == seeds  # the seed histogram's measurements account for its cost
    train = PrivacyCost.from_fraction(  # the accountant's figure, rounded up as documented
        "zcdp", Fraction(_library_rho(record["noise_multiplier"], 15)) * (1 + FLOAT_MARGIN))
    assert fitted.spent == seeds + train
    assert fitted.spent <= budget
    assert fitted.spent.value > budget.value * Fraction(999_999, 1_000_000)  # nothing wasted
    assert seeds <= PrivacyCost.zcdp("0.01")  # the declared 20% share
    assert described["parameters"]["mode"] == "dp"
    # The histogram's DP diagnostics, and the check of the drawn rows (post-processing).
    assert set(described["diagnostics"]) == {"seeds", "checks"}
    assert [c["check"] for c in described["diagnostics"]["checks"]] == [
        "sample keeps the seed marginals"]
    assert abs(fitted.rows - 5000) < 200  # a DP estimate, not the true count
    codes = _codes(fitted.sample(400, np.random.default_rng(1)), domain)
    assert np.all((codes >= 0) & (codes < np.array(domain.shape)))


def test_dp_mode_needs_zcdp(source: tuple[duckdb.DuckDBPyRelation, Domain]) -> None:
    relation, domain = source
    with pytest.raises(ConfigurationError, match="zcdp"):
        get("modp", mode="dp", steps="2").fit(relation, domain, PrivacyCost.pure(1),
                                             np.random.default_rng(0))


def test_dp_mode_with_an_infinite_budget_adds_no_noise(
        source: tuple[duckdb.DuckDBPyRelation, Domain]) -> None:
    relation, domain = source
    fitted = get("modp", mode="dp", blades="1", steps="3").fit(
        relation, domain, PrivacyCost.unbounded("zcdp"), np.random.default_rng(0))
    assert fitted.spent.infinite
    assert fitted.rows == 5000
    assert fitted.describe()["parameters"]["dpsgd"]["noise_multiplier"] == 0.0
