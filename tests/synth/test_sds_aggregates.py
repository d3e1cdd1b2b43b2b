"""SDS DP aggregates: tuple machinery, contribution bounding, percentile, noise, budget.

Statistical checks state their false-positive rate (FALSE_POSITIVE_RATE per check,
for a correct implementation and a random seed) and show they reject a wrong scale.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from fractions import Fraction
from itertools import combinations, pairwise
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dpsql import noise
from dpsql.errors import ConfigurationError
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.privacy import PrivacyCost, rho_from_epsilon_delta
from dpsql.synth import available, get
from dpsql.synth.sds import SDS
from dpsql.synth.sds.aggregates import (
    Level,
    Settings,
    bounded_counts,
    dp_percentile,
    gaussian,
    kept_tuples,
    normalize,
    percentile_scores,
    prune_uncovered,
    record_keys,
    split_budget,
)
from dpsql.synth.sds.tuples import EMPTY, Items, TupleSpace, TupleTable, candidates
from tests.conftest import ADULT_SAMPLE
from tests.synth.sds_fixtures import (
    COLUMNS,
    FakeDomainItems,
    item_rows,
    levels_from,
    open_adult,
    source_and_domain,
    tuple_counts,
)

FALSE_POSITIVE_RATE = 1e-6


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    store = open_adult(tmp_path_factory.mktemp("sds"))
    yield store
    store.close()


def budget(epsilon: float = 1.0) -> PrivacyCost:
    return rho_from_epsilon_delta(epsilon, 1e-6)


def exact(text: dict) -> Fraction:
    """The exact rho of a cost's ``as_dict()`` form."""
    return Fraction(text["rho"])


# --------------------------------------------------------------------------- tuple machinery


def all_tuples(items: Items, k: int) -> np.ndarray:
    out = [t for t in combinations(range(items.count), k)
           if len(set(items.column[list(t)].tolist())) == k]
    return np.array(out, dtype=np.int64).reshape(-1, k)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_dense_keys_are_a_bijection_onto_the_space(k: int) -> None:
    items = FakeDomainItems([3, 2, 4, 1, 2])
    space = TupleSpace(items.sizes, k)
    keys = space.item_keys(items, all_tuples(items, k))
    assert len(np.unique(keys)) == len(keys) == space.total
    assert keys.min() == 0
    assert keys.max() == space.total - 1


def test_record_keys_agree_with_item_keys() -> None:
    items = FakeDomainItems([3, 2, 4, 2])
    rng = np.random.default_rng(0)
    codes = np.stack([rng.integers(-1, s, 50) for s in items.sizes], axis=1)
    rows = items.from_codes(codes)
    space = TupleSpace(items.sizes, 2)
    keys, full = space.record_keys(items.to_codes(rows))
    for r, row in enumerate(rows):
        for j, cols in enumerate(space.column_sets):
            pair = row[cols]
            assert full[r, j] == bool(np.all(pair != EMPTY))
            if full[r, j]:
                assert keys[r, j] == space.item_keys(items, pair[None, :])[0]


def test_candidates_are_the_apriori_join() -> None:
    items = FakeDomainItems([3, 2, 4, 2, 3])
    rng = np.random.default_rng(1)
    for k in (2, 3, 4):
        lower = all_tuples(items, k - 1)
        survivors = lower[rng.random(len(lower)) < 0.6]
        space = TupleSpace(items.sizes, k - 1)
        table = TupleTable(space, space.item_keys(items, survivors))
        got = {tuple(t) for t in candidates(items, survivors, table).tolist()}
        kept = {tuple(t) for t in survivors.tolist()}
        want = {t for t in map(tuple, all_tuples(items, k).tolist())
                if all(sub in kept for sub in combinations(t, k - 1))}
        assert got == want


def test_table_lookup_dense_and_sorted_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    items = FakeDomainItems([4, 3, 5])
    space = TupleSpace(items.sizes, 2)
    tuples = all_tuples(items, 2)[::3]
    dense = TupleTable(space, space.item_keys(items, tuples), np.arange(len(tuples)) + 1)
    monkeypatch.setattr("dpsql.synth.sds.tuples.DENSE_LIMIT", 0)
    sparse = TupleTable(space, space.item_keys(items, tuples), np.arange(len(tuples)) + 1)
    probe = space.item_keys(items, all_tuples(items, 2))
    np.testing.assert_array_equal(dense.find(probe), sparse.find(probe))
    np.testing.assert_array_equal(dense.get(probe), sparse.get(probe))
    assert (dense.get(probe) > 0).sum() == len(tuples)


# --------------------------------------------------------------------------- contribution bounding


def pair_table(items: Items) -> TupleTable:
    singles = np.arange(items.count, dtype=np.int64)[:, None]
    space1 = TupleSpace(items.sizes, 1)
    cand = candidates(items, singles, TupleTable(space1, singles[:, 0]))
    space = TupleSpace(items.sizes, 2)
    return TupleTable(space, space.item_keys(items, cand))


@pytest.mark.parametrize("allowed", [0, 1, 4, 15])
def test_no_record_keeps_more_than_allowed(store, allowed: int) -> None:
    rows, items = item_rows(store)
    table = pair_table(items)
    keys = record_keys(rows, seed=7)
    valid = np.zeros(len(rows), dtype=np.int64)
    for r, row in enumerate(rows):
        present = row[row != EMPTY]
        valid[r] = math.comb(len(present), 2)
    kept = np.zeros(len(rows), dtype=np.int64)
    for rec, pos in kept_tuples(rows, keys, items, table, allowed, 2):
        np.add.at(kept, rec, 1)
        own = table.keys[pos]  # every kept tuple is one of the record's own
        for r_i, key in zip(rec[:50], own[:50], strict=True):
            present = rows[r_i][rows[r_i] != EMPTY]
            mine = table.space.item_keys(items, np.array(list(combinations(present, 2))))
            assert key in mine
    np.testing.assert_array_equal(kept, np.minimum(valid, allowed))


def test_a_records_choice_depends_only_on_itself(store) -> None:
    """Neighbours differ in the bounded counts by exactly one record's kept tuples."""
    rows, items = item_rows(store)
    table = pair_table(items)
    allowed = 3
    base = bounded_counts(rows, record_keys(rows, 11), items, table, allowed, 2)
    for extra in (rows[17], rows[4000]):  # a duplicate of an existing record, and another
        grown = np.insert(rows, 123, extra, axis=0)
        after = bounded_counts(grown, record_keys(grown, 11), items, table, allowed, 2)
        diff = after - base
        assert diff.min() >= 0
        assert diff.max() <= 1
        assert allowed >= diff.sum() >= 1
    removed = np.delete(rows, 250, axis=0)
    after = bounded_counts(removed, record_keys(removed, 11), items, table, allowed, 2)
    diff = base - after
    assert diff.min() >= 0
    assert diff.max() <= 1
    assert diff.sum() <= allowed


def test_kept_subsets_are_uniform() -> None:
    """Over seeds, each of a record's v tuples is kept with probability allowed / v."""
    items = FakeDomainItems([2, 3, 2, 2, 3])
    row = items.from_codes(np.array([[1, 2, 0, 1, 2]]))
    table = pair_table(items)
    allowed, draws = 3, 20_000
    hits = np.zeros(len(table), dtype=np.int64)
    for seed in range(draws):
        for _, pos in kept_tuples(row, record_keys(row, seed), items, table, allowed, 2):
            hits[pos] += 1
    own = hits[hits > 0]
    assert len(own) == math.comb(5, 2)
    p = allowed / len(own)
    for h in own:
        assert stats.binomtest(int(h), draws, p).pvalue >= FALSE_POSITIVE_RATE / len(own)


# --------------------------------------------------------------------------- DP percentile


def test_percentile_score_is_zero_exactly_at_the_percentile() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        values = rng.integers(0, 12, rng.integers(1, 60))
        hist = np.bincount(values, minlength=15)
        for p in (1, 37, 50, 95, 99, 100):
            scores = percentile_scores(hist, p)
            want = int(np.percentile(values, p, method="inverted_cdf"))
            assert scores.max() == 0
            assert int(np.argmax(scores)) == want


def test_percentile_score_sensitivity_bound_is_tight() -> None:
    rng = np.random.default_rng(4)
    for p in (1, 30, 99):
        worst = 0
        for _ in range(300):
            hist = np.bincount(rng.integers(0, 8, rng.integers(1, 40)), minlength=9)
            for v in range(9):
                grown = hist.copy()
                grown[v] += 1
                change = np.abs(percentile_scores(grown, p) - percentile_scores(hist, p)).max()
                worst = max(worst, int(change))
        assert worst == max(p, 100 - p)


def test_dp_percentile_scale_and_cost_at_the_boundary() -> None:
    part = PrivacyCost.zcdp("0.0001")
    hist = np.bincount(np.full(1000, 5), minlength=11)
    _, scale, cost = dp_percentile(hist, 99, 2, part)
    sensitivity = 2 * 2 * 99
    assert scale == noise.used_laplace_scale(LaplaceMechanism.calibrate(sensitivity, part).scale)
    assert cost <= part
    assert cost == LaplaceMechanism(Fraction(sensitivity), scale).cost("zcdp")
    # epsilon = 2 Delta / scale is the loss; a smaller part would not cover it
    eps = Fraction(sensitivity) / scale
    assert LaplaceMechanism(Fraction(sensitivity), scale).check(sensitivity, PrivacyCost.pure(eps))
    assert not LaplaceMechanism(Fraction(sensitivity), scale).check(
        sensitivity, PrivacyCost.pure(eps * Fraction(999_999, 1_000_000)))
    # Above the percentile a score falls by only n (100 - p) = 1,000, below it by 99,000
    # (1.8 noise scales): of 400 draws about 7 land below 5 (1.85% each, measured over
    # 4,000). 30 or more has probability 2e-10 (binomial tail); a choice blind to the
    # scores lands there 45% of the time.
    draws = [dp_percentile(hist, 99, 2, part)[0] for _ in range(400)]
    assert sum(d < 5 for d in draws) < 30
    strong = PrivacyCost.zcdp("0.01")
    many = np.bincount(np.full(100_000, 5), minlength=11)
    # scores fall by >= 1e5 away from 5, the noise scale is ~2.8e3: P(miss) < e^-30
    assert dp_percentile(many, 99, 2, strong)[0] == 5


def test_dp_percentile_is_exact_without_noise() -> None:
    hist = np.array([5, 0, 90, 4, 1])
    assert dp_percentile(hist, 99, 1, PrivacyCost.unbounded("zcdp"))[0] == 3
    assert dp_percentile(hist, 50, 1, PrivacyCost.unbounded("zcdp"))[0] == 2


# --------------------------------------------------------------------------- Gaussian counts


N_NOISE = 200_000
Z = stats.norm.isf(FALSE_POSITIVE_RATE / 2)


def variance_ok(draws: np.ndarray, sigma2: float) -> bool:
    """Two-sided test of E[X^2] = sigma2 for near-Gaussian draws (Var(X^2) ~ 2 sigma2^2)."""
    mean_square = float((draws.astype(float) ** 2).mean())
    return abs(mean_square - sigma2) <= Z * sigma2 * math.sqrt(2 / N_NOISE)


def test_gaussian_noise_has_the_calibrated_variance() -> None:
    sens2, part = Fraction(4 * 15), PrivacyCost.zcdp("0.02")  # max_rows 2, s_k 15
    noisy, sigma2, cost = gaussian(np.zeros(N_NOISE, dtype=np.int64), sens2, part)
    want = float(sens2 / (2 * part.value))
    assert float(sigma2) == pytest.approx(want, rel=2**-19)
    assert variance_ok(noisy, want)
    # the check has power: a scale 0.7x or 1.3x would be rejected
    for factor in (0.7, 1.3):
        assert abs(factor**2 - 1) > 2 * Z * math.sqrt(2 / N_NOISE)
    assert cost <= part
    assert cost == PrivacyCost.from_fraction("zcdp", sens2 / (2 * sigma2))


def test_gaussian_noise_test_rejects_a_wrong_scale() -> None:
    draws = noise.discrete_gaussian(1.3**2 * 150.0, N_NOISE)
    assert not variance_ok(draws, 150.0)
    draws = noise.discrete_gaussian(0.7**2 * 150.0, N_NOISE)
    assert not variance_ok(draws, 150.0)


# --------------------------------------------------------------------------- budget


def settings(**overrides) -> Settings:
    base = dict(reporting_length=3, percentile=99, percentile_share=Fraction(1, 100),
                rows_share=Fraction(5, 1000), sigma_proportions=(1.0, 0.5, 1 / 3),
                threshold_type="adaptive", thresholds=(1.0, 1.0, 1.0))
    base.update(overrides)
    return Settings(**base)


def test_split_budget_never_exceeds_and_follows_the_proportions() -> None:
    total = budget(1.0)
    rows, pct, marg = split_budget(total, settings(), count_rows=True)
    assert rows is not None
    parts = [rows, *pct, *marg]
    assert sum(parts[1:], parts[0]) <= total
    assert total.units - sum(p.units for p in parts) <= len(parts)  # only rounding is lost
    ratios = [float(m.value / marg[0].value) for m in marg]
    assert ratios == pytest.approx([1, 4, 9], rel=1e-12)  # rho_k ~ 1 / p_k^2
    public = split_budget(total, settings(), count_rows=False)
    assert public[0] is None
    assert public[2][0] > marg[0]


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 4.0])
def test_fit_spends_at_most_the_budget_and_almost_all_of_it(store, epsilon: float) -> None:
    source, domain = source_and_domain(store)
    total = budget(epsilon)
    fitted = SDS().fit(source, domain, total, np.random.default_rng(0))
    assert fitted.spent <= total
    assert fitted.spent.value >= total.value * (1 - Fraction(1, 2**18))
    described = fitted.describe()
    count, *lengths = described["measurements"]
    parts = [exact(count["cost"])]
    for step in lengths:
        parts += [exact(step["percentile_cost"]), exact(step["cost"])]
    assert sum(parts) == fitted.spent.value
    assert exact(described["cost"]) == fitted.spent.value
    json.dumps(described)


def test_public_row_count_is_used_and_frees_its_share(store) -> None:
    source, domain = source_and_domain(store)
    counted = SDS().fit(source, domain, budget(), np.random.default_rng(0))
    public = SDS().fit(source, replace(domain, public_rows=4321), budget(),
                       np.random.default_rng(0))
    assert public.rows == 4321  # the declared number, not the 5000 rows there are
    assert public.describe()["measurements"][0] == {"measure": "record_count", "declared": 4321}
    public_k1 = public.describe()["measurements"][1]
    counted_k1 = counted.describe()["measurements"][1]
    assert public_k1["sigma"] < counted_k1["sigma"]
    assert public.spent <= budget()


def test_pure_dp_budget_is_refused(store) -> None:
    source, domain = source_and_domain(store)
    with pytest.raises(ConfigurationError, match="zcdp"):
        SDS().fit(source, domain, PrivacyCost.pure(1), np.random.default_rng(0))


def test_privacy_unit_scales_the_sensitivity(tmp_path: Path) -> None:
    lines = ADULT_SAMPLE.read_text().splitlines()
    csv = tmp_path / "units.csv"
    csv.write_text("\n".join([lines[0] + ",unit"]
                             + [f"{line},{i // 3}" for i, line in enumerate(lines[1:])]) + "\n")
    text = (Path(__file__).resolve().parents[2] / "dpsql" / "data" / "adult.yaml").read_text()
    text = text.replace("privacy_unit: null      # each row is one person",
                        "privacy_unit: unit\n    max_rows: 2")
    text = text.replace("      income_50k:", "      unit: {type: hidden}\n      income_50k:")
    policy = tmp_path / "units.yaml"
    policy.write_text(text)
    store = open_adult(tmp_path, policy, csv)
    try:
        source, domain = source_and_domain(store)
        assert domain.max_rows == 2
        part = split_budget(budget(), settings(sigma_proportions=SDS().sigmas), count_rows=True)[2]
        fitted = SDS().fit(source, domain, budget(), np.random.default_rng(0))
        for step, rho_k in zip(fitted.describe()["measurements"][1:], part, strict=True):
            want = 4 * step["allowed_sensitivity"] / (2 * float(rho_k.value))  # m^2 s_k / 2 rho_k
            assert step["sigma"] ** 2 == pytest.approx(want, rel=2**-19)
    finally:
        store.close()


# --------------------------------------------------------------------------- exactness


def test_infinite_budget_releases_the_exact_counts(store) -> None:
    source, domain = source_and_domain(store)
    synth = SDS(percentile=100, threshold_type="fixed", thresholds=(0, 0, 0))
    fitted = synth.fit(source, domain, PrivacyCost.unbounded("zcdp"), np.random.default_rng(0))
    assert fitted.spent.infinite
    rows, _ = item_rows(store)
    assert fitted.rows == len(rows)
    for level in fitted.aggregates.levels:
        want = tuple_counts(rows, level.k)
        got = dict(zip(map(tuple, level.rows.tolist()), level.table.values.tolist(), strict=True))
        assert got == want


def test_normalization_invariant_on_random_aggregates() -> None:
    items = FakeDomainItems([3, 4, 2, 3, 2])
    rng = np.random.default_rng(5)
    for _ in range(20):
        levels: list[Level] = []
        survivors = np.empty((0, 0), dtype=np.int64)
        previous = None
        for k in (1, 2, 3, 4):
            cand = candidates(items, survivors, previous)
            survivors = cand[rng.random(len(cand)) < 0.7]
            space = TupleSpace(items.sizes, k)
            previous = TupleTable(space, space.item_keys(items, survivors),
                                  rng.integers(1, 100, len(survivors)))
            survivors = survivors[previous.order]
            levels.append(Level(k, survivors, previous))
        normalize(levels, items)
        for lower, upper in pairwise(levels):
            for j in range(upper.k):
                sub = np.delete(upper.rows, j, axis=1)
                parent = lower.table.get(lower.table.space.item_keys(items, sub))
                assert np.all(parent > 0)  # filtered tuples propagate: sub-tuples were released
                assert np.all(upper.table.values <= parent)


def kept(levels: list[Level]) -> set[tuple[int, ...]]:
    return {tuple(t) for level in levels for t in level.rows.tolist()}


def test_a_pair_no_value_accounts_for_is_pruned() -> None:
    # column A: items 0 (a0, count 10), 1 (a1, 5); column B: 2 (b0, 8), 3 (b1, 6), 4 (b2, 1)
    items = FakeDomainItems([2, 3])
    counts = {(0,): 10, (1,): 5, (2,): 8, (3,): 6, (4,): 1,
              (0, 2): 8, (0, 4): 3, (0, 3): 2,  # a0's extensions, largest first: 8, 3, 2
              (1, 3): 5, (1, 4): 1}
    levels = levels_from(items, counts)
    assert prune_uncovered(levels, items) == [1]
    # (a0, b1): a0's larger extensions already sum to 11 >= 10, but b1's to 5 < 6: kept.
    # (a1, b2): a1's larger ones sum to 5 >= 5 and b2's to 3 >= 1: dropped.
    assert kept(levels) == set(counts) - {(1, 4)}


def covered_by_brute_force(levels: list[Level], items: Items) -> set[tuple[int, ...]]:
    """The rule of prune_uncovered, written tuple by tuple."""
    out = {tuple(t) for t in levels[0].rows.tolist()}
    counts = {tuple(t): int(v) for level in levels
              for t, v in zip(level.rows.tolist(), level.table.values.tolist(), strict=True)}
    for level in levels[1:]:
        tuples = [tuple(t) for t in level.rows.tolist()]
        present = {t for t in tuples
                   if all(t[:j] + t[j + 1:] in out for j in range(len(t)))}
        for t in present:
            for j in range(len(t)):
                sub, column = t[:j] + t[j + 1:], items.column[t[j]]
                larger = sum(counts[u] for u in present
                             if set(sub) <= set(u) and u != t and counts[u] > counts[t]
                             and items.column[(set(u) - set(sub)).pop()] == column)
                if larger < counts[sub]:
                    out.add(t)
                    break
    return out


def test_pruning_matches_the_rule_on_random_aggregates() -> None:
    items = FakeDomainItems([3, 4, 2, 3])
    rng = np.random.default_rng(11)
    pruned = 0
    ties = 0
    for _ in range(15):
        levels: list[Level] = []
        survivors = np.empty((0, 0), dtype=np.int64)
        previous = None
        for k in (1, 2, 3):
            cand = candidates(items, survivors, previous)
            survivors = cand[rng.random(len(cand)) < 0.8]
            space = TupleSpace(items.sizes, k)
            values = rng.integers(1, 12, len(survivors)) * (1 if k == 1 else 2)  # with ties
            previous = TupleTable(space, space.item_keys(items, survivors), values)
            survivors = survivors[previous.order]
            levels.append(Level(k, survivors, previous))
            ties += len(values) - len(np.unique(values))
        want = covered_by_brute_force(levels, items)
        before = kept(levels)
        dropped = prune_uncovered(levels, items)
        assert kept(levels) == want
        assert sum(dropped) == len(before - want)
        pruned += sum(dropped)
        for lower, upper in pairwise(levels):  # no tuple outlives a sub-tuple
            for j in range(upper.k):
                sub = np.delete(upper.rows, j, axis=1)
                assert np.all(lower.table.find(lower.table.space.item_keys(items, sub)) >= 0)
    assert pruned > 0  # the random counts do break the rule
    assert ties > 0


def test_tied_extensions_rank_together() -> None:
    # a0 (count 10) has three extensions into B, all 5: none has a larger one, so all are
    # covered by a0, whatever their codes (ranked by code, the third would have 10 above
    # it). Each b's own count (5) is exceeded by its pair with a1, so a0 alone decides.
    items = FakeDomainItems([2, 3])
    counts = {(0,): 10, (1,): 20, (2,): 5, (3,): 5, (4,): 5,
              (0, 2): 5, (0, 3): 5, (0, 4): 5, (1, 2): 6, (1, 3): 6, (1, 4): 6}
    levels = levels_from(items, counts)
    assert prune_uncovered(levels, items) == [0]


def test_exact_counts_lose_nothing_to_pruning(store) -> None:
    rows, items = item_rows(store)
    counts = {t: c for k in (1, 2, 3) for t, c in tuple_counts(rows, k).items()}
    levels = levels_from(items, counts)
    assert prune_uncovered(levels, items) == [0, 0]


def test_released_tuples_keep_their_sub_tuples(store) -> None:
    source, domain = source_and_domain(store)
    fitted = SDS(threshold_type="fixed", thresholds=(50, 40, 30)).fit(
        source, domain, budget(1.0), np.random.default_rng(0))
    levels = fitted.aggregates.levels
    for level, floor in zip(levels, (50, 40, 30), strict=False):
        assert np.all(level.table.values > floor)  # normalization keeps them above
    for lower, upper in pairwise(levels):
        for j in range(upper.k):
            sub = np.delete(upper.rows, j, axis=1)
            assert np.all(lower.table.find(lower.table.space.item_keys(fitted.items, sub)) >= 0)


# --------------------------------------------------------------------------- options


def test_registered_and_options_read_from_strings() -> None:
    assert "sds" in available()
    synth = get("sds", reporting_length="2", sigma_proportions="1,0.5",
                thresholds="0.1,0.5", use_synthetic_counts="false", percentile="95")
    assert isinstance(synth, SDS)
    assert synth.sigma_proportions == (1.0, 0.5)
    assert synth.thresholds == (0.1, 0.5)
    assert synth.use_synthetic_counts is False
    assert synth.parameters(40)["reporting_length"] == 2
    assert synth.parameters(40)["thresholds"] == [0.1, 0.5]


def test_default_thresholds_filter_absent_values_by_domain_size() -> None:
    """Adaptive eta_1 defaults to 1/(domain values): the expected number of released
    values absent from the data stays below one half, whatever the domain's size."""
    assert SDS().levels(50) == (0.02, 1.0, 1.0)
    assert SDS(reporting_length=2).levels(1) == (1.0, 1.0)
    assert SDS(threshold_type="fixed").levels(50) == (0.0, 0.0, 0.0)
    assert SDS(thresholds=(0.5, 0.5, 0.5)).levels(50) == (0.5, 0.5, 0.5)


def test_fit_applies_the_default_thresholds(store) -> None:
    source, domain = source_and_domain(store)
    fitted = SDS().fit(source, domain, budget(), np.random.default_rng(0))
    values = fitted.items.count
    described = fitted.describe()
    assert described["parameters"]["thresholds"] == [1 / values, 1.0, 1.0]
    _, one, *longer = described["measurements"]
    assert one["threshold"] == pytest.approx(one["sigma"] * stats.norm.isf(0.5 / values))
    assert all(step["threshold"] == 0 for step in longer)


@pytest.mark.parametrize("options", [
    pytest.param({"reporting_length": "0"}, id="length_zero"),
    pytest.param({"percentile": "101"}, id="percentile"),
    pytest.param({"percentile_epsilon_proportion": "0.6",
                  "number_of_records_epsilon_proportion": "0.5"}, id="shares_sum"),
    pytest.param({"sigma_proportions": "1,0"}, id="sigma_zero"),
    pytest.param({"sigma_proportions": "1,1"}, id="sigma_length"),
    pytest.param({"threshold_type": "loose"}, id="threshold_type"),
    pytest.param({"thresholds": "0,1,1"}, id="eta_zero"),
    pytest.param({"weight_selection_percentile": "120"}, id="weight_percentile"),
    pytest.param({"reporting_lenght": "2"}, id="typo"),
])
def test_bad_options_are_refused(options: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError):
        get("sds", **options)


def test_reporting_length_longer_than_the_columns_is_refused(store) -> None:
    source, domain = source_and_domain(store, COLUMNS[:2])
    with pytest.raises(ConfigurationError, match="reporting_length"):
        SDS().fit(source, domain, budget(), np.random.default_rng(0))
