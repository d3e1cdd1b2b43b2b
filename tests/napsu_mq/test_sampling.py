"""Forward sampling on the junction tree draws records from P_theta."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpsql.synth.napsu_mq import model
from dpsql.synth.napsu_mq.sampling import sample_records
from dpsql.synth.napsu_mq.structure import Structure
from tests.napsu_mq.test_model import enumerate_model

FALSE_POSITIVE_RATE = 1e-6  # per chi-square check
DRAWS = 60_000


def joint_counts(structure: Structure, records: np.ndarray) -> np.ndarray:
    flat = np.ravel_multi_index(tuple(records.T), structure.sizes)
    return np.bincount(flat, minlength=int(np.prod(structure.sizes)))


@pytest.mark.parametrize(("sizes", "cliques"), [
    pytest.param((2, 3, 2), [(0, 1), (1, 2), (0, 2)], id="triangle"),
    pytest.param((3, 2, 2, 3), [(0, 1), (2, 3)], id="forest"),
    pytest.param((2, 2, 3, 2), [(0, 1, 2), (2, 3)], id="three_way"),
])
def test_joint_frequencies_match_p_theta(sizes: tuple[int, ...],
                                         cliques: list[tuple[int, ...]]) -> None:
    structure = Structure.build(sizes, cliques)
    theta = np.random.default_rng(5).normal(0, 1.0, structure.dim)
    points, p, *_ = enumerate_model(structure, theta)
    order = np.ravel_multi_index(tuple(np.array(points).T), sizes)
    expected = np.empty_like(p)
    expected[order] = p
    with jax.enable_x64(True):
        tables = [np.asarray(t) for t in model.compiled_marginals(structure)(jnp.asarray(theta))]
    records = sample_records(structure, tables, DRAWS, np.random.default_rng(9))
    counts = joint_counts(structure, records)
    critical = stats.chi2.ppf(1 - FALSE_POSITIVE_RATE, p.size - 1)
    assert stats.chisquare(counts, DRAWS * expected).statistic < critical
    # Power: the law of a visibly different theta (scaled by 1.3) must be rejected.
    _, wrong, *_ = enumerate_model(structure, 1.3 * theta)
    wrong_expected = np.empty_like(wrong)
    wrong_expected[order] = wrong
    assert stats.chisquare(counts, DRAWS * wrong_expected).statistic > critical


def test_records_stay_in_the_domain_with_empty_cells() -> None:
    structure = Structure.build((3, 4), [(0, 1)])
    table = np.zeros((3, 4))
    table[1, 2] = 0.75
    table[2, 0] = 0.25
    records = sample_records(structure, [table], 20_000, np.random.default_rng(1))
    seen = {tuple(r) for r in records}
    assert seen <= {(1, 2), (2, 0)}
    assert (records[:, 0] == 1).mean() == pytest.approx(0.75, abs=0.02)
    assert set(itertools.chain.from_iterable(seen)) <= set(range(4))
