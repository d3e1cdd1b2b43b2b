"""SDS aggregate-seeded synthesis: the loop's rules, its incremental state, determinism."""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import combinations

import numpy as np
import pyarrow as pa
import pytest

from dpsql.errors import ConfigurationError
from dpsql.privacy import PrivacyCost, rho_from_epsilon_delta
from dpsql.synth.sds import SDS, FittedSDS, synthesis
from dpsql.synth.sds.synthesis import Options, Synthesizer, _Batch, _insert, _kept, _percentile
from dpsql.synth.sds.tuples import EMPTY, Items
from dpsql.synth.sds.weights import Weights, dependence
from tests.synth.sds_fixtures import (
    FakeDomainItems,
    levels_from,
    open_adult,
    source_and_domain,
    tuple_counts,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    store = open_adult(tmp_path_factory.mktemp("sds_synthesis"))
    yield store
    store.close()


@pytest.fixture(scope="module")
def fitted(store) -> FittedSDS:
    source, domain = source_and_domain(store)
    return SDS().fit(source, domain, rho_from_epsilon_delta(2, 1e-6), np.random.default_rng(0))


def sampler(fitted: FittedSDS, use_synthetic_counts: bool = True, percentile: int = 95):
    nullable = np.array([a.null_code is not None for a in fitted.domain.attributes])
    return Synthesizer(fitted.items, fitted.aggregates.levels, nullable,
                       Options(use_synthetic_counts, percentile))


def released(fitted: FittedSDS) -> set[tuple[int, ...]]:
    return {tuple(t) for level in fitted.aggregates.levels for t in level.rows.tolist()}


# --------------------------------------------------------------------------- the output


def test_sample_is_a_table_of_domain_codes(fitted: FittedSDS) -> None:
    table = fitted.sample(700, np.random.default_rng(1))
    assert isinstance(table, pa.Table)
    assert table.num_rows == 700
    assert table.column_names == list(fitted.domain.names)
    for attribute in fitted.domain.attributes:
        codes = table.column(attribute.name).to_numpy()
        assert codes.min() >= 0
        assert codes.max() < attribute.size
    assert fitted.diagnostics["empty_cells"] == 0  # no column of this domain is nullable
    decoded = fitted.domain.decode(table, np.random.default_rng(0))
    assert decoded.num_rows == 700


def test_same_seed_same_records(fitted: FittedSDS) -> None:
    a = fitted.sample(500, np.random.default_rng(42))
    b = fitted.sample(500, np.random.default_rng(42))
    c = fitted.sample(500, np.random.default_rng(43))
    assert a.equals(b)
    assert not a.equals(c)


@pytest.mark.parametrize(("synthetic", "percentile"), [(True, 95), (False, 30)],
                         ids=["synthetic_counts_95", "counts_30"])
def test_dense_look_ups_sample_exactly_what_sorted_keys_do(fitted: FittedSDS, monkeypatch,
                                                           synthetic: bool,
                                                           percentile: int) -> None:
    """The dense pair and triple tables (filled in every order of a tuple's items, so the
    loop never sorts) only speed up the look-ups: the same seed gives the same records as
    the released tables' sorted keys, so the speed-up cannot have moved the distribution."""
    assert {2, 3} <= set(Weights(fitted.items, fitted.aggregates.levels, 1.0, True)._dense)
    fast = sampler(fitted, synthetic, percentile).sample(800, 800, np.random.default_rng(5))
    monkeypatch.setattr("dpsql.synth.sds.weights.DENSE_TUPLES", 0)
    slow = sampler(fitted, synthetic, percentile).sample(800, 800, np.random.default_rng(5))
    assert np.array_equal(fast[0], slow[0])
    assert fast[1] == slow[1]


def test_zero_rows_and_bad_counts(fitted: FittedSDS) -> None:
    assert fitted.sample(0, np.random.default_rng(0)).num_rows == 0
    with pytest.raises(ConfigurationError):
        fitted.sample(-1, np.random.default_rng(0))


@pytest.mark.parametrize("use_synthetic_counts", [True, False])
def test_the_loop_never_leaves_the_aggregates(fitted: FittedSDS,
                                              use_synthetic_counts: bool) -> None:
    """Records from the SDS loop at full length only hold released combinations."""
    synth = sampler(fitted, use_synthetic_counts)
    weights = Weights(fitted.items, fitted.aggregates.levels, 1.0, use_synthetic_counts)
    allowance = weights.single.copy()
    batch = _Batch.empty(400, fitted.items.columns)
    synth._grow(batch, synth.length, weights, allowance, np.random.default_rng(3), True)
    assert batch.size.min() >= 1
    known = released(fitted)
    for row in batch.record.tolist():
        present = [x for x in row if x != EMPTY]
        assert len({int(fitted.items.column[x]) for x in present}) == len(present)
        for k in range(1, synth.length + 1):
            for combo in combinations(present, k):
                assert combo in known
    assert weights.finish(batch.record, np.ones(400, dtype=bool)) == 0


def test_relaxed_records_are_counted(fitted: FittedSDS) -> None:
    fitted.sample(fitted.rows, np.random.default_rng(5))
    diagnostics = fitted.diagnostics
    filled = diagnostics["cells_filled"]
    assert sum(filled.values()) == fitted.rows * fitted.items.columns
    assert list(filled) == ["length_3", "length_2", "paired", "length_1", "without_allowance"]
    assert filled["length_3"] > filled["length_2"] + filled["paired"] + filled["length_1"]
    relaxed = sum(filled.values()) - filled["length_3"]
    assert 0 <= diagnostics["records_outside_aggregates"] <= relaxed
    json.dumps(fitted.describe())


def _grown(fitted: FittedSDS, scale: float, seed: int) -> tuple[Weights, _Batch]:
    """300 synthetic records grown and finished, with the weights they used."""
    synth = sampler(fitted, True)
    weights = Weights(fitted.items, fitted.aggregates.levels, scale, True)
    batch = _Batch.empty(300, fitted.items.columns)
    synth._grow(batch, synth.length, weights, weights.single.copy(),
                np.random.default_rng(seed), True)
    weights.finish(batch.record, np.zeros(300, dtype=bool))
    return weights, batch


def test_synthetic_counts_match_the_records(fitted: FittedSDS) -> None:
    weights, batch = _grown(fitted, 1.0, 0)
    for level, used in zip(fitted.aggregates.levels, weights.used, strict=True):
        counts: dict[tuple[int, ...], int] = {}
        for row in batch.record.tolist():
            for combo in combinations([x for x in row if x != EMPTY], level.k):
                counts[combo] = counts.get(combo, 0) + 1
        for position, tup in enumerate(map(tuple, level.rows.tolist())):
            assert used[position] == counts.get(tup, 0)


def test_weights_read_the_counts_left_after_finished_records(fitted: FittedSDS) -> None:
    """With synthetic counts a tuple weighs count * scale minus what finished records used."""
    weights, _ = _grown(fitted, 0.5, 1)
    for level, used in zip(fitted.aggregates.levels, weights.used, strict=True):
        assert used.sum() > 0
        got = weights.value([level.rows[:, j] for j in range(level.k)])
        np.testing.assert_array_equal(got, level.table.values * 0.5 - used[:-1])


@pytest.mark.parametrize("descending", [True, False], ids=["largest", "smallest"])
def test_inserting_into_the_kept_extremes_equals_a_sort(descending: bool) -> None:
    """The compare-exchange merge keeps exactly what sorting each row would, pads and ties too."""
    rng = np.random.default_rng(8)
    pad = -np.inf if descending else np.inf
    rows, keep = 400, 4
    top = np.where(rng.random((rows, keep)) < 0.2, pad, rng.integers(-3, 9, (rows, keep)))
    top = -np.sort(-top, axis=1) if descending else np.sort(top, axis=1)
    values = [np.where(rng.random(rows) < 0.3, pad, rng.integers(-3, 9, rows)).astype(float)
              for _ in range(5)]
    for new in (values, values[:1], []):
        merged = np.sort(np.concatenate([top, np.array(new).T.reshape(rows, -1)], axis=1),
                         axis=1)
        want = merged[:, ::-1][:, :keep] if descending else merged[:, :keep]
        np.testing.assert_array_equal(_insert(top, new, descending), want)


@pytest.mark.parametrize("percentile", [95, 50, 5])
def test_keeping_more_extremes_samples_the_same_records(fitted: FittedSDS, monkeypatch,
                                                        percentile: int) -> None:
    """The kept width is enough: a wider state reads the same percentiles, draws the same."""
    config = replace(fitted.config, weight_selection_percentile=percentile)
    model = FittedSDS(config, fitted.domain, fitted.items, fitted.aggregates)
    narrow = model.sample(1500, np.random.default_rng(4))
    kept = synthesis._kept
    monkeypatch.setattr(synthesis, "_kept", lambda q, longest: (kept(q, longest)[0] + 3,
                                                                kept(q, longest)[1]))
    assert model.sample(1500, np.random.default_rng(4)).equals(narrow)


# --------------------------------------------------------------------------- the weights


@pytest.mark.parametrize("q", [0.0, 0.1, 0.5, 0.95, 1.0])
def test_percentile_from_kept_extremes_equals_numpy(q: float) -> None:
    rng = np.random.default_rng(7)
    longest = 40
    keep, descending = _kept(q, longest)
    counts = rng.integers(1, longest + 1, 500)
    values = [rng.integers(1, 1000, c).astype(float) for c in counts]
    top = np.array([(np.sort(v)[::-1] if descending else np.sort(v)).tolist()[:keep]
                    + [np.nan] * max(0, keep - len(v)) for v in values])
    got = _percentile(np.nan_to_num(top), counts, q, descending)
    want = np.array([np.percentile(v, 100 * q) for v in values])
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("stagger", [False, True], ids=["lockstep", "staggered"])
def test_incremental_state_equals_a_fresh_computation(fitted: FittedSDS, stagger: bool) -> None:
    """The state grown step by step equals the one built from scratch for the same record.

    Staggered: every other record joins one step late (as a record that waits for
    its allowance does) and stops one item short, so one step extends records of
    different sizes and those records are still short enough to draw by their
    direct count.
    """
    synth = sampler(fitted, use_synthetic_counts=False, percentile=80)
    weights = Weights(fitted.items, fitted.aggregates.levels, 1.0, False)
    allowance = np.full(fitted.items.count, 1e9)
    rng = np.random.default_rng(11)
    grown = _Batch.empty(60, fitted.items.columns)
    synth._grow(grown, synth.length, weights, allowance, rng, True)
    late = np.arange(60) % 2 if stagger else np.zeros(60, dtype=np.int64)
    for steps in range(1, 5):
        partial = _Batch.empty(60, fitted.items.columns)
        for t in range(steps):
            rows = np.flatnonzero((grown.size > t) & (t < steps - late))
            x = grown.sequence[rows, t]
            partial.add(rows, x, fitted.items.column[x])
        fresh = synth._start(partial, np.arange(60), partial.record == EMPTY, synth.length,
                             weights, allowance, True)
        stepwise = synth._start(_Batch.empty(60, fitted.items.columns), np.arange(60),
                                partial.record == EMPTY, synth.length, weights, allowance, True)
        replay = _Batch.empty(60, fitted.items.columns)
        for t in range(steps):
            rows = np.flatnonzero((late <= t) & (partial.size > t - late))
            chosen = np.full(60, EMPTY)
            chosen[rows] = partial.sequence[rows, t - late[rows]]
            grows = np.isin(stepwise.owner, rows)
            extend = np.flatnonzero(grows & (
                fitted.items.column[stepwise.cand]
                != fitted.items.column[np.maximum(chosen, 0)[stepwise.owner]]))
            keep = ~grows  # a record that does not grow this step keeps its pairs, as in _grow
            keep[extend[synth._extend(stepwise, extend, chosen, replay, synth.length,
                                      weights)]] = True
            stepwise = stepwise.take(keep)
            replay.add(rows, chosen[rows], fitted.items.column[chosen[rows]])
        done = partial.size == steps - late
        a = {(o, c): i for i, (o, c) in enumerate(zip(fresh.owner, fresh.cand, strict=True))
             if done[o]}
        b = {(o, c): i for i, (o, c) in enumerate(zip(stepwise.owner, stepwise.cand,
                                                      strict=True)) if done[o]}
        assert a.keys() == b.keys()
        for key, i in a.items():
            j = b[key]
            assert fresh.count[i] == stepwise.count[j]
            within = partial.size[key[0]] + 1 <= synth.length
            if within:
                assert fresh.direct[i] == stepwise.direct[j]
            wa = _percentile(fresh.top[i:i + 1], fresh.count[i:i + 1], synth.q, synth.descending)
            wb = _percentile(stepwise.top[j:j + 1], stepwise.count[j:j + 1], synth.q,
                             synth.descending)
            assert wa == pytest.approx(wb)


# --------------------------------------------------------------------------- products


def test_aggregates_product(fitted: FittedSDS) -> None:
    table = fitted.products()["aggregates"]
    assert table.column_names == ["tuple", "length", "noisy_count"]
    assert table.num_rows == sum(len(level.rows) for level in fitted.aggregates.levels)
    lengths = table.column("length").to_numpy()
    assert set(lengths.tolist()) == {1, 2, 3}
    assert table.column("noisy_count").to_numpy().min() >= 1
    for text, k in zip(table.column("tuple").to_pylist()[:200], lengths[:200], strict=True):
        parts = text.split(";")
        assert len(parts) == k
        assert all(part.split("=", 1)[0] in fitted.domain.names for part in parts)


def test_nullable_columns_keep_empty_values(tmp_path) -> None:
    """A nullable column's NULL is 'empty': it makes no tuple, and synthesis may leave it."""
    from tests.conftest import ADULT_SAMPLE

    lines = ADULT_SAMPLE.read_text().splitlines()
    header = lines[0].split(",")
    j = header.index("workclass")
    out = [lines[0]]
    for i, line in enumerate(lines[1:]):
        cells = line.split(",")
        if i % 4 == 0:
            cells[j] = ""
        out.append(",".join(cells))
    csv = tmp_path / "nulls.csv"
    csv.write_text("\n".join(out) + "\n")
    from tests.conftest import ADULT_POLICY

    text = ADULT_POLICY.read_text().replace(
        "workclass:      {type: categorical, values: [0, 1, 2, 3, 4, 5, 6, 7, 8]}",
        "workclass:      {type: categorical, values: [null, 0, 1, 2, 3, 4, 5, 6, 7, 8]}")
    policy = tmp_path / "nulls.yaml"
    policy.write_text(text)
    store = open_adult(tmp_path, policy, csv)
    try:
        source, domain = source_and_domain(store)
        null = domain["workclass"].null_code
        assert null is not None
        fitted = SDS().fit(source, domain, PrivacyCost.unbounded("zcdp"),
                           np.random.default_rng(0))
        ones = fitted.aggregates.levels[0].rows[:, 0]
        assert not np.any(ones >= fitted.items.count)  # the NULL code is no item
        table = fitted.sample(2000, np.random.default_rng(0))
        share = float((table.column("workclass").to_numpy() == null).mean())
        assert 0.1 < share < 0.4  # a quarter of the data is empty there
    finally:
        store.close()


# --------------------------------------------------------------------------- the paired pass


A, B, G, C, D = range(5)  # the columns of determined()


def determined(n: int = 900, seed: int = 0, drop: set[tuple[int, ...]] | None = None):
    """Exact 1- and 2-way aggregates of records over a (12 values), b = a // 3, g = b % 2,
    and independent c and d; ``drop``: pairs (of items) left out.

    Returns the items, the levels and a sampler over them.
    """
    items = FakeDomainItems([12, 4, 2, 3, 3])
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 12, n)
    codes = np.stack([a, a // 3, a // 3 % 2, rng.integers(0, 3, n), rng.integers(0, 3, n)],
                     axis=1)
    rows = items.from_codes(codes)
    counts = {t: c for k in (1, 2) for t, c in tuple_counts(rows, k).items()
              if t not in (drop or set())}
    levels = levels_from(items, counts)
    synth = Synthesizer(items, levels, np.zeros(5, dtype=bool), Options(True, 95))
    return items, levels, synth


def entropy(items: Items, levels: list, column: int) -> float:
    p = levels[0].table.get(np.flatnonzero(items.column == column)).astype(float)
    p /= p.sum()
    return float(-(p * np.log(p)).sum())


def test_dependence_reads_mutual_information_from_the_pairs() -> None:
    items, levels, _ = determined()
    explained = dependence(items, levels)
    assert explained[B, A] == pytest.approx(1.0)  # a determines b
    assert explained[A, B] == pytest.approx(entropy(items, levels, B) / entropy(items, levels, A))
    assert explained[G, B] == pytest.approx(1.0)  # I(b; g) = H(g)
    assert explained[B, G] == pytest.approx(entropy(items, levels, G) / entropy(items, levels, B))
    assert explained[C, D] < 0.02  # c and d are independent
    assert explained[D, C] < 0.02
    assert np.all(np.diag(explained) == 0)


def test_a_table_thresholds_thinned_out_does_not_pass_for_a_determination() -> None:
    """Keep (a, c) pairs only for a < 4, c = a % 3: alone, those pairs make c a function
    of a; they hold about a ninth of the records, and the score says so."""
    items, levels, _ = determined()
    pairs = {tuple(t) for t in levels[1].rows.tolist()}
    a_c = {t for t in pairs if items.column[t[0]] == A and items.column[t[1]] == C}
    keep = {(x, int(items.offsets[C]) + x % 3) for x in range(4)} & a_c
    items, levels, _ = determined(drop=a_c - keep)
    explained = dependence(items, levels)
    held = sum(int(levels[1].table.get(levels[1].table.space.item_keys(items, np.array([t])))[0])
               for t in keep)
    assert explained[C, A] == pytest.approx(held / 900)  # the information share is 1
    assert explained[C, A] < 0.2


def test_dependence_equals_the_contingency_tables(fitted: FittedSDS) -> None:
    items, levels = fitted.items, fitted.aggregates.levels
    pairs = np.zeros((items.count, items.count))
    pairs[levels[1].rows[:, 0], levels[1].rows[:, 1]] = np.maximum(levels[1].table.values, 0)
    pairs += pairs.T
    ones = np.maximum(levels[0].table.get(np.arange(items.count)), 0)
    explained = dependence(items, levels)
    for c in range(items.columns):
        for a in range(items.columns):
            block = pairs[np.ix_(items.column == c, items.column == a)]
            if a == c or block.sum() == 0:
                continue
            p = block / block.sum()
            pc, pa = p.sum(axis=1), p.sum(axis=0)
            nz = p > 0
            info = (p[nz] * np.log(p[nz] / np.outer(pc, pa)[nz])).sum()
            entropy = -(pc[pc > 0] * np.log(pc[pc > 0])).sum()
            share = min(1.0, block.sum() / min(ones[items.column == c].sum(),
                                               ones[items.column == a].sum()))
            assert explained[c, a] == pytest.approx(share * info / entropy, abs=1e-9)


def half_filled(items: Items, n: int, rng: np.random.Generator) -> _Batch:
    """Records with a and g filled (consistently) and b, c, d open."""
    batch = _Batch.empty(n, items.columns)
    a = rng.integers(0, 12, n)
    batch.add(np.arange(n), items.offsets[A] + a, np.full(n, A))
    batch.add(np.arange(n), items.offsets[G] + a // 3 % 2, np.full(n, G))
    return batch


@pytest.mark.parametrize("dense", [True, False])
def test_the_paired_pass_draws_each_value_from_its_best_anchor(monkeypatch, dense: bool) -> None:
    """b is explained fully by a, half by g: drawn with a, it always matches a // 3."""
    if not dense:
        monkeypatch.setattr("dpsql.synth.sds.weights.DENSE_TUPLES", 0)
    items, levels, synth = determined()
    weights = Weights(items, levels, 1.0, True)
    assert (2 in weights._dense) == dense
    allowance = weights.single.copy()
    start = allowance.copy()
    rng = np.random.default_rng(1)
    batch = half_filled(items, 300, rng)
    synth._pair_fill(batch, weights, allowance, rng)
    codes = items.to_codes(batch.record)
    assert np.all(codes != EMPTY)
    assert np.array_equal(codes[:, B], codes[:, A] // 3)  # with g as anchor: half would not
    used = start - allowance
    assert np.all(used[items.column != A] <= np.ceil(start[items.column != A]))


def test_a_cell_its_anchor_cannot_fill_is_left_to_length_1() -> None:
    """Drop every pair of a = 0 with b: records with a = 0 keep b open; the others fill it."""
    items, _, _ = determined()
    drop = {(0, int(items.offsets[B]) + v) for v in range(4)}
    items, levels, synth = determined(drop=drop)
    weights = Weights(items, levels, 1.0, True)
    rng = np.random.default_rng(2)
    batch = half_filled(items, 400, rng)
    synth._pair_fill(batch, weights, weights.single.copy(), rng)
    codes = items.to_codes(batch.record)
    zero = codes[:, A] == 0
    assert zero.sum() > 10
    assert np.all(codes[zero, B] == EMPTY)
    assert np.all(codes[zero][:, [C, D]] != EMPTY)  # their other cells are filled
    assert np.array_equal(codes[~zero, B], codes[~zero, A] // 3)


def test_a_value_out_of_allowance_is_not_drawn() -> None:
    items, levels, synth = determined()
    weights = Weights(items, levels, 1.0, True)
    allowance = weights.single.copy()
    allowance[items.offsets[C]] = 0  # c = 0 is used up
    rng = np.random.default_rng(3)
    batch = half_filled(items, 300, rng)
    synth._pair_fill(batch, weights, allowance, rng)
    codes = items.to_codes(batch.record)
    assert np.all(codes[:, C] != EMPTY)
    assert not np.any(codes[:, C] == 0)


def test_without_the_pair_counts_the_same_cells_break_the_dependence() -> None:
    """The length-1 pass on the same records: b no longer follows a (why the pass exists)."""
    items, levels, synth = determined()
    weights = Weights(items, levels, 1.0, True)
    rng = np.random.default_rng(1)
    batch = half_filled(items, 300, rng)
    synth._grow(batch, 1, weights, weights.single.copy(), rng, True)
    codes = items.to_codes(batch.record)
    assert np.mean(codes[:, B] == codes[:, A] // 3) < 0.5


def test_the_paired_pass_can_be_turned_off(fitted: FittedSDS) -> None:
    nullable = np.array([a.null_code is not None for a in fitted.domain.attributes])
    off = Synthesizer(fitted.items, fitted.aggregates.levels, nullable, Options(True, 95, False))
    assert [name for name, *_ in off.stages()] == ["length_3", "length_2", "length_1",
                                                    "without_allowance"]
