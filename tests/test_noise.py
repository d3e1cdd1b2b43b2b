"""Tests for the exact samplers (dpsql.noise, dpsql._exact) and their accuracy figures.

The samplers read the OS CSPRNG on purpose and cannot be seeded. To keep the
statistical tests reproducible, an autouse fixture swaps the private entropy
source for a PCG64 byte stream seeded from the test id; tests that request
the ``os_entropy`` fixture keep the real source (buffering, locking, fork safety, and one
goodness-of-fit check per sampler on real OS bytes).

Every statistical check states its false-positive rate (the probability that a
correct sampler fails it, for a random seed) and derives its acceptance bound
from the exact distribution. Goodness-of-fit checks also prove their power:
each is run on draws from a deliberately wrong scale (x0.7, x1.3) and must
reject them, and the noncentral chi-square bound shows that rejection is not
luck.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpsql import _exact, noise
from dpsql.errors import ConfigurationError

FALSE_POSITIVE_RATE = 1e-6  # per statistical check; ~60 checks -> < 1e-4 for the whole file
N_DRAWS = 200_000
TARGET_BINS = 50
MIN_EXPECTED = 5.0  # chi-square needs at least ~5 expected per bin


class SeededEntropy:
    """Deterministic stand-in for the OS entropy source (tests only)."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def take(self, nbytes: int) -> bytes:
        return self._rng.bytes(nbytes)


@pytest.fixture
def os_entropy() -> None:
    """Request this to keep the real OS entropy source in a test."""


@pytest.fixture(autouse=True)
def seeded_entropy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if "os_entropy" in request.fixturenames:
        return
    seed = int.from_bytes(hashlib.sha256(request.node.nodeid.encode()).digest()[:8], "little")
    monkeypatch.setattr(_exact, "ENTROPY", SeededEntropy(seed))


# --------------------------------------------------------------------------- reference laws


def laplace_cdf(k: npt.ArrayLike, scale: float) -> np.ndarray:
    """P(Z <= k) for the discrete Laplace, closed form (accurate in both tails)."""
    k = np.asarray(k, dtype=np.float64)
    r = math.exp(-1 / scale)
    low = np.exp(-np.abs(k) / scale) / (1 + r)  # P(Z <= k) for k < 0, = P(Z >= |k|)
    high = 1 - np.exp(-(k + 1) / scale) / (1 + r)
    return np.where(k < 0, low, high)


def gaussian_pmf(z: npt.ArrayLike, sigma2: float) -> np.ndarray:
    zmax = math.ceil(40 * math.sqrt(sigma2)) + 10
    support = np.arange(-zmax, zmax + 1, dtype=np.float64)
    total = np.exp(-(support**2) / (2 * sigma2)).sum()
    return np.exp(-(np.asarray(z, dtype=np.float64) ** 2) / (2 * sigma2)) / total


def gaussian_cdf(k: npt.ArrayLike, sigma2: float) -> np.ndarray:
    """P(Z <= k) from the summed pmf, using symmetry so both tails keep their precision."""
    zmax = math.ceil(40 * math.sqrt(sigma2)) + 10
    lower = np.cumsum(gaussian_pmf(np.arange(-zmax, 1), sigma2))  # P(Z <= i - zmax)
    k = np.asarray(k)
    idx = np.where(k < 0, k, -k - 1) + zmax
    below = np.where(idx >= 0, lower[np.clip(idx, 0, None)], 0.0)
    return np.where(k < 0, below, 1 - below)


def laplace_law(scale: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda k: laplace_cdf(k, scale)


def gaussian_law(sigma2: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda k: gaussian_cdf(k, sigma2)


# --------------------------------------------------------------------------- chi-square machinery


def make_bins(cdf: Callable[[np.ndarray], np.ndarray], lo: int, hi: int, n: int) -> np.ndarray:
    """Upper bin edges u_0 < ... (bins (-inf,u_0], (u_0,u_1], ..., (u_last, inf)), ~equiprobable.

    Bins whose expected count under ``n`` draws is below MIN_EXPECTED are merged.
    """
    support = np.arange(lo, hi + 1)
    c = cdf(support)
    edges = np.unique(support[np.searchsorted(c, np.arange(1, TARGET_BINS) / TARGET_BINS)])
    edges = edges[edges < hi]
    while edges.size > 1:
        p = bin_probs(cdf, edges)
        if p.min() * n >= MIN_EXPECTED:
            break
        i = int(np.argmin(p))  # merge the thinnest bin into a neighbour by dropping an edge
        edges = np.delete(edges, min(i, edges.size - 1))
    return edges


def bin_probs(cdf: Callable[[np.ndarray], np.ndarray], edges: np.ndarray) -> np.ndarray:
    c = cdf(edges)
    upper_tail = cdf(-edges[-1:] - 1)  # P(Z > u) = P(Z <= -u-1) by symmetry
    return np.concatenate(([c[0]], np.diff(c), upper_tail))


def chi2_gof(
    draws: np.ndarray, cdf: Callable[[np.ndarray], np.ndarray], span: int
) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Chi-square statistic of ``draws`` against ``cdf`` and its FALSE_POSITIVE_RATE threshold."""
    edges = make_bins(cdf, -span, span, draws.size)
    p = bin_probs(cdf, edges)
    observed = np.bincount(np.searchsorted(edges, draws, side="left"), minlength=p.size)
    expected = draws.size * p
    stat = float(((observed - expected) ** 2 / expected).sum())
    return stat, float(stats.chi2.isf(FALSE_POSITIVE_RATE, p.size - 1)), edges, p


def assert_power(
    null_cdf: Callable[[np.ndarray], np.ndarray],
    alt_cdf: Callable[[np.ndarray], np.ndarray],
    span: int,
    n: int,
) -> None:
    """The GOF test of size n rejects ``alt`` with probability >= 1 - FALSE_POSITIVE_RATE."""
    edges = make_bins(null_cdf, -span, span, n)
    p0, p1 = bin_probs(null_cdf, edges), bin_probs(alt_cdf, edges)
    threshold = stats.chi2.isf(FALSE_POSITIVE_RATE, p0.size - 1)
    noncentrality = n * float(((p1 - p0) ** 2 / p0).sum())
    assert stats.ncx2.cdf(threshold, p0.size - 1, noncentrality) < FALSE_POSITIVE_RATE


def laplace_span(scale: float) -> int:
    return math.ceil(40 * scale) + 5


def gaussian_span(sigma: float) -> int:
    return math.ceil(12 * sigma) + 5


LAPLACE_SCALES = [0.3, 1, 10, 1000, Fraction(7, 3), 1 / 0.7]
GAUSSIAN_SIGMAS = [0.5, 1, 3, 200]
WRONG_FACTORS = [0.7, 1.3]


# --------------------------------------------------------------------------- building blocks


def _uniform_bins(m: int, bins: int = 100) -> tuple[int, np.ndarray]:
    """Bin width w and exact bin probabilities for x // w with x uniform on [0, m)."""
    w = -(-m // bins)
    nb = -(-m // w)
    sizes = np.array([min(w, m - j * w) for j in range(nb)], dtype=np.float64)
    return w, sizes / m


@pytest.mark.parametrize(
    "m",
    [
        2,
        3,
        5,
        7,
        10,
        17,
        100,
        255,
        256,
        257,
        1000,
        4097,
        65537,
        2**28 + 3,
        2**33,
        2**40 + 3,
        3 * 2**61,
        2**63 - 1,
    ],
)
def test_uniform_below_is_uniform(m: int) -> None:
    x = _exact.uniform_below(m, N_DRAWS)
    assert x.dtype == np.int64
    assert x.min() >= 0
    assert x.max() < m
    w, p = _uniform_bins(m)
    observed = np.bincount(x // w, minlength=p.size)
    expected = N_DRAWS * p
    stat = ((observed - expected) ** 2 / expected).sum()
    assert stat <= stats.chi2.isf(FALSE_POSITIVE_RATE, p.size - 1)


@pytest.mark.parametrize("wide", [False, True], ids=["narrow_words", "64bit_words"])
def test_uniform_below_array_bounds(wide: bool) -> None:
    bounds = [2, 3, 7, 1]
    m = np.tile(np.array(bounds + ([2**40 + 1] if wide else []), dtype=np.int64), 40_000)
    x = _exact.uniform_below(m)
    assert np.all((x >= 0) & (x < m))
    for b in (3, 7):
        sel = x[m == b]
        observed = np.bincount(sel, minlength=b)
        expected = sel.size / b
        stat = ((observed - expected) ** 2 / expected).sum()
        assert stat <= stats.chi2.isf(FALSE_POSITIVE_RATE, b - 1)
    assert np.all(x[m == 1] == 0)


def binomial_ok(successes: int, n: int, p: float) -> bool:
    """Two-sided exact binomial test at FALSE_POSITIVE_RATE."""
    return stats.binomtest(successes, n, p).pvalue >= FALSE_POSITIVE_RATE


@pytest.mark.parametrize(
    ("num", "den"), [(1, 3), (2, 7), (1, 2), (123_456_789, 2**40 + 15), (0, 5), (5, 5)]
)
def test_bernoulli_rational(num: int, den: int) -> None:
    b = _exact.bernoulli(num, den, N_DRAWS)
    assert binomial_ok(int(b.sum()), N_DRAWS, num / den)


@pytest.mark.parametrize(
    ("num", "den"), [(0, 1), (1, 3), (1, 2), (1, 1), (5, 2), (7, 1), (22, 7), (2**61, 2**62 - 1)]
)
def test_bernoulli_exp(num: int, den: int) -> None:
    b = _exact.bernoulli_exp(np.full(N_DRAWS, num, dtype=np.int64), den)
    assert binomial_ok(int(b.sum()), N_DRAWS, math.exp(-num / den))


def test_bernoulli_exp_splits_overflowing_rounds() -> None:
    # den * K >= 2**63 from K = 2 on, so every later round takes the product path
    den = 2**62 - 1
    b = _exact.bernoulli_exp_frac(np.full(N_DRAWS, den, dtype=np.int64), den)
    assert binomial_ok(int(b.sum()), N_DRAWS, math.exp(-1))


@pytest.mark.parametrize(("num", "den"), [(3 * 2**70 + 5, 2**71), (5, 7), (10**30, 10**30)])
def test_bernoulli_exp_big_ints(num: int, den: int) -> None:
    n = 20_000
    hits = sum(_exact.bernoulli_exp_int(num, den) for _ in range(n))
    assert binomial_ok(hits, n, math.exp(-num / den))


def test_geometric_counts() -> None:
    v = _exact.exp_minus_one_successes(N_DRAWS)
    r = math.exp(-1)
    top = 12
    p = np.array([(1 - r) * r**k for k in range(top)] + [r**top])
    observed = np.bincount(np.minimum(v, top), minlength=top + 1)
    stat = ((observed - N_DRAWS * p) ** 2 / (N_DRAWS * p)).sum()
    assert stat <= stats.chi2.isf(FALSE_POSITIVE_RATE, top)


# --------------------------------------------------------------------------- discrete Laplace


@pytest.mark.parametrize("scale", LAPLACE_SCALES, ids=str)
def test_discrete_laplace_goodness_of_fit(scale: float) -> None:
    used = float(noise.used_laplace_scale(scale))
    draws = noise.discrete_laplace(scale, N_DRAWS)
    assert draws.dtype == np.int64
    assert draws.shape == (N_DRAWS,)
    stat, threshold, _, _ = chi2_gof(draws, laplace_law(used), laplace_span(used))
    assert stat <= threshold


@pytest.mark.parametrize("factor", WRONG_FACTORS)
@pytest.mark.parametrize("scale", [0.3, 1, 10, 1000])
def test_discrete_laplace_check_rejects_wrong_scale(scale: float, factor: float) -> None:
    span = laplace_span(scale * max(factor, 1))
    assert_power(laplace_law(scale), laplace_law(scale * factor), span, N_DRAWS)
    draws = noise.discrete_laplace(scale * factor, N_DRAWS)
    stat, threshold, _, _ = chi2_gof(draws, laplace_law(scale), span)
    assert stat > threshold


# --------------------------------------------------------------------------- discrete Gaussian


@pytest.mark.parametrize("sigma", GAUSSIAN_SIGMAS)
def test_discrete_gaussian_goodness_of_fit(sigma: float) -> None:
    used = float(noise.used_gaussian_sigma2(sigma**2))
    draws = noise.discrete_gaussian(sigma**2, N_DRAWS)
    assert draws.dtype == np.int64
    stat, threshold, _, _ = chi2_gof(draws, gaussian_law(used), gaussian_span(sigma))
    assert stat <= threshold


def test_discrete_gaussian_inexact_sigma2() -> None:
    sigma2 = 2 / 3  # a float with a 2**53 denominator: rounded up to c_num / 2**k
    used = noise.used_gaussian_sigma2(sigma2)
    assert used != Fraction(sigma2)
    draws = noise.discrete_gaussian(sigma2, N_DRAWS)
    stat, threshold, _, _ = chi2_gof(draws, gaussian_law(float(used)), gaussian_span(1))
    assert stat <= threshold


@pytest.mark.parametrize("factor", WRONG_FACTORS)
@pytest.mark.parametrize("sigma", [0.5, 3, 200])
def test_discrete_gaussian_check_rejects_wrong_scale(sigma: float, factor: float) -> None:
    span = gaussian_span(sigma * max(factor, 1))
    wrong = (sigma * factor) ** 2
    assert_power(gaussian_law(sigma**2), gaussian_law(wrong), span, N_DRAWS)
    draws = noise.discrete_gaussian(wrong, N_DRAWS)
    stat, threshold, _, _ = chi2_gof(draws, gaussian_law(sigma**2), span)
    assert stat > threshold


@pytest.mark.parametrize("d_max", [16, 17, 30], ids=["q_far_0", "q_far_1", "q_far_3"])
def test_discrete_gaussian_overflow_path(d_max: int) -> None:
    # sigma^2 = 9 = t * c_num / c_den with t = 4, c = 9/4, so den = 288 and
    # d = 4|Y| - 9. A tiny d_max sends |Y| >= a_far through the path that real
    # parameters take only when d^2 >= 2**63: q_far = d_max^2 // den exp(-1)
    # trials vectorized, the rest in Python ints.
    n = 50_000
    draws = _exact.discrete_gaussian(4, 9, 4, n, d_max=d_max)
    stat, threshold, _, _ = chi2_gof(draws, gaussian_law(9.0), gaussian_span(3))
    assert stat <= threshold
    a_far = (9 + d_max) // 4 + 1
    p_far = float(2 * (1 - gaussian_cdf(a_far - 1, 9.0)))
    assert binomial_ok(int((np.abs(draws) >= a_far).sum()), n, p_far)


# --------------------------------------------------------------------------- a few draws at a time

# Up to _exact.SCALAR_DRAWS draws per call take the Python-int path (a global
# aggregate draws one). These checks go through the public samplers, one small
# call after another, with fewer draws than above (each call is ~20 us); the
# power checks show the smaller samples still reject a wrong scale.
SCALAR_N = 20_000


def small_calls(sample: Callable[[int], np.ndarray], n: int = SCALAR_N) -> np.ndarray:
    size = _exact.SCALAR_DRAWS
    return np.concatenate([sample(size) for _ in range(-(-n // size))])[:n]


@pytest.mark.parametrize("scale", [0.3, 10, Fraction(7, 3), 1000], ids=str)
def test_few_laplace_draws_fit(scale: float) -> None:
    used = float(noise.used_laplace_scale(scale))
    draws = small_calls(lambda k: noise.discrete_laplace(scale, k))
    assert draws.dtype == np.int64
    stat, threshold, _, _ = chi2_gof(draws, laplace_law(used), laplace_span(used))
    assert stat <= threshold


@pytest.mark.parametrize("sigma", [0.5, 3, 200, 2 / 3])
def test_few_gaussian_draws_fit(sigma: float) -> None:
    used = float(noise.used_gaussian_sigma2(sigma**2))
    draws = np.concatenate([noise.discrete_gaussian(sigma**2, 1) for _ in range(SCALAR_N)])
    assert draws.dtype == np.int64
    stat, threshold, _, _ = chi2_gof(draws, gaussian_law(used), gaussian_span(sigma))
    assert stat <= threshold


@pytest.mark.parametrize("factor", WRONG_FACTORS)
def test_few_draws_checks_reject_a_wrong_scale(factor: float) -> None:
    span = laplace_span(10 * max(factor, 1))
    assert_power(laplace_law(10), laplace_law(10 * factor), span, SCALAR_N)
    draws = small_calls(lambda k: noise.discrete_laplace(10 * factor, k))
    stat, threshold, _, _ = chi2_gof(draws, laplace_law(10), span)
    assert stat > threshold
    span = gaussian_span(3 * max(factor, 1))
    assert_power(gaussian_law(9), gaussian_law((3 * factor) ** 2), span, SCALAR_N)
    draws = small_calls(lambda k: noise.discrete_gaussian((3 * factor) ** 2, k))
    stat, threshold, _, _ = chi2_gof(draws, gaussian_law(9), span)
    assert stat > threshold


def test_few_draws_use_the_entropy_source_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def run() -> list[np.ndarray]:
        monkeypatch.setattr(_exact, "ENTROPY", SeededEntropy(99))
        return [noise.discrete_laplace(3, 1), noise.discrete_gaussian(5, _exact.SCALAR_DRAWS)]

    for a, b in zip(run(), run(), strict=True):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- real OS entropy


def test_os_entropy_laplace_and_gaussian_fit(os_entropy: None) -> None:
    lap = noise.discrete_laplace(10, N_DRAWS)
    stat, threshold, _, _ = chi2_gof(lap, laplace_law(10), laplace_span(10))
    assert stat <= threshold
    gau = noise.discrete_gaussian(9, N_DRAWS)
    stat, threshold, _, _ = chi2_gof(gau, gaussian_law(9), gaussian_span(3))
    assert stat <= threshold


def test_entropy_is_never_handed_out_twice_across_threads(os_entropy: None) -> None:
    # 8 threads x 200 calls x 500 64-bit words. Equal words among 800k uniform
    # 64-bit values happen with probability < 800_000**2 / 2**65 < 2e-8.
    chunks: list[np.ndarray] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [_exact.words(64, 500).copy() for _ in range(200)]
        with lock:
            chunks.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    allw = np.concatenate(chunks)
    assert allw.size == 800_000
    assert np.unique(allw).size == allw.size


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_does_not_replay_parent_entropy(os_entropy: None) -> None:
    _exact.words(8, 1)  # make sure the parent holds a partly used buffer
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.write(write_end, bytes(_exact.ENTROPY.take(64)))
        finally:
            os._exit(0)
    os.close(write_end)
    child = b""
    while len(child) < 64:
        part = os.read(read_end, 64 - len(child))
        if not part:
            break
        child += part
    os.close(read_end)
    os.waitpid(pid, 0)
    parent = bytes(_exact.ENTROPY.take(64))
    assert len(child) == 64
    assert child != parent  # equal with probability 2**-512 unless the buffer is shared


def test_all_randomness_comes_from_the_entropy_source(monkeypatch: pytest.MonkeyPatch) -> None:
    def run() -> tuple[np.ndarray, np.ndarray]:
        monkeypatch.setattr(_exact, "ENTROPY", SeededEntropy(1234))
        return noise.discrete_laplace(3, 1000), noise.discrete_gaussian(5, 1000)

    a, b = run(), run()
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


# --------------------------------------------------------------------------- OpenDP agreement


@pytest.fixture(scope="module")
def opendp_draws() -> Callable[[str, float, int], np.ndarray]:
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    cache: dict[tuple[str, float, int], np.ndarray] = {}

    def draw(kind: str, scale: float, n: int) -> np.ndarray:
        key = (kind, scale, n)
        if key not in cache:
            domain = dp.vector_domain(dp.atom_domain(T=int))
            if kind == "laplace":
                meas = dp.m.make_laplace(domain, dp.l1_distance(T=int), scale=scale)
            else:
                meas = dp.m.make_gaussian(domain, dp.l2_distance(T=int), scale=scale)
            cache[key] = np.asarray(meas([0] * n), dtype=np.int64)
        return cache[key]

    return draw


def two_sample_chi2(a: np.ndarray, b: np.ndarray, edges: np.ndarray) -> tuple[float, float]:
    """Chi-square homogeneity statistic of two samples on shared bins, and its threshold."""
    table = np.stack(
        [
            np.bincount(np.searchsorted(edges, x, side="left"), minlength=edges.size + 1)
            for x in (a, b)
        ]
    )
    table = table[:, table.sum(axis=0) > 0]
    res = stats.chi2_contingency(table, correction=False)
    return float(res.statistic), float(stats.chi2.isf(FALSE_POSITIVE_RATE, table.shape[1] - 1))


OPENDP_N = 100_000


@pytest.mark.parametrize(
    ("kind", "scale"), [("laplace", 0.5), ("laplace", 20.0), ("gaussian", 0.7), ("gaussian", 20.0)]
)
def test_matches_opendp(opendp_draws: Callable[..., np.ndarray], kind: str, scale: float) -> None:
    theirs = opendp_draws(kind, scale, OPENDP_N)
    if kind == "laplace":
        ours = noise.discrete_laplace(scale, OPENDP_N)
        law, span = laplace_law(scale), laplace_span(scale)
        wrong = noise.discrete_laplace(scale * 1.3, OPENDP_N)
    else:
        ours = noise.discrete_gaussian(scale**2, OPENDP_N)
        law, span = gaussian_law(scale**2), gaussian_span(scale)
        wrong = noise.discrete_gaussian((scale * 1.3) ** 2, OPENDP_N)
    edges = make_bins(law, -span, span, OPENDP_N)
    stat, threshold = two_sample_chi2(ours, theirs, edges)
    assert stat <= threshold
    # same scale convention: OpenDP's own draws fit our reference law
    stat, threshold, _, _ = chi2_gof(theirs, law, span)
    assert stat <= threshold
    # and the two-sample test can tell a 30% wider scale apart
    stat, threshold = two_sample_chi2(wrong, theirs, edges)
    assert stat > threshold


# --------------------------------------------------------------------------- parameters


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=2**-16, max_value=2**40, allow_nan=False, allow_infinity=False))
def test_used_laplace_scale_rounds_up_tightly(x: float) -> None:
    used = noise.used_laplace_scale(x)
    assert used >= Fraction(x)
    assert used <= Fraction(x) * (1 + Fraction(1, 2**20))


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=2**-16, max_value=2.5e15, allow_nan=False, allow_infinity=False))
def test_used_gaussian_sigma2_rounds_up_tightly(x: float) -> None:
    used = noise.used_gaussian_sigma2(x)
    assert used >= Fraction(x)
    assert used <= Fraction(x) * (1 + Fraction(1, 2**20))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.floats(min_value=2**-20, max_value=2.5e15, allow_nan=False),
        st.fractions(min_value=Fraction(1, 2**20), max_value=10**12, max_denominator=10**15),
    )
)
def test_used_values_are_fixed_points(x: float | Fraction) -> None:
    # callers record used_*(x) and may pass it back in: it must not be rounded again
    if x <= noise.MAX_LAPLACE_SCALE:
        scale = noise.used_laplace_scale(x)
        assert noise.used_laplace_scale(scale) == scale
    sigma2 = noise.used_gaussian_sigma2(x)
    assert noise.used_gaussian_sigma2(sigma2) == sigma2


@pytest.mark.parametrize(
    "x",
    [
        # just below (8475.5)^2: rounding c up moves round(sigma) from 8475 to 8476, and
        # the first representation's value is not one of the second's
        Fraction(71834100.18688858),
        Fraction(14580942.246843813),
        *(Fraction(s) ** 2 * (1 - Fraction(1, 2**22)) for s in (1.5, 2.5, 1000.5, 5e7 - 0.5)),
    ],
    ids=str,
)
def test_used_sigma2_is_a_fixed_point_where_t_steps(x: Fraction) -> None:
    used = noise.used_gaussian_sigma2(x)
    assert x <= used <= x * (1 + Fraction(1, 2**20))
    assert noise.used_gaussian_sigma2(used) == used


@settings(max_examples=200, deadline=None)
@given(st.fractions(min_value=Fraction(1, 2**16), max_value=10**6))
def test_used_values_round_up_for_fractions(x: Fraction) -> None:
    assert x <= noise.used_laplace_scale(x) <= x * (1 + Fraction(1, 2**20))
    assert x <= noise.used_gaussian_sigma2(x) <= x * (1 + Fraction(1, 2**20))


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.floats(min_value=2**-20, max_value=2**40, allow_nan=False),
        st.fractions(min_value=Fraction(1, 2**20), max_value=2**40, max_denominator=10**15),
    )
)
def test_laplace_sampler_runs_for_every_valid_scale(x: float | Fraction) -> None:
    draws = noise.discrete_laplace(x, 50)  # InternalError if a representation overflowed
    assert draws.dtype == np.int64
    assert draws.shape == (50,)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.floats(min_value=2**-20, max_value=2.5e15, allow_nan=False),
        st.fractions(min_value=Fraction(1, 2**20), max_value=10**12, max_denominator=10**15),
    )
)
def test_gaussian_sampler_runs_for_every_valid_sigma2(x: float | Fraction) -> None:
    draws = noise.discrete_gaussian(x, 50)
    assert draws.dtype == np.int64
    assert draws.shape == (50,)


@pytest.mark.parametrize(
    ("given_value", "laplace", "sigma2"),
    [
        pytest.param(10, Fraction(10), Fraction(10), id="int"),
        pytest.param(10.0, Fraction(10), Fraction(10), id="float_int"),
        pytest.param(Fraction(7, 3), Fraction(7, 3), Fraction(7, 3), id="fraction"),
        pytest.param(0.25, Fraction(1, 4), Fraction(1, 4), id="dyadic"),
        pytest.param(np.float64(9.0), Fraction(9), Fraction(9), id="numpy_float"),
        pytest.param(Fraction(1, 10**9), Fraction(1, 2**16), Fraction(1, 2**16), id="floor"),
    ],
)
def test_used_values_exact_cases(given_value: object, laplace: Fraction, sigma2: Fraction) -> None:
    assert noise.used_laplace_scale(given_value) == laplace  # type: ignore[arg-type]
    assert noise.used_gaussian_sigma2(given_value) == sigma2  # type: ignore[arg-type]


def test_one_over_float_epsilon_rounds_to_the_intended_scale() -> None:
    assert noise.used_laplace_scale(1 / Fraction(0.1)) == 10


def test_limits_are_inclusive() -> None:
    assert noise.used_laplace_scale(noise.MAX_LAPLACE_SCALE) == noise.MAX_LAPLACE_SCALE
    assert noise.used_gaussian_sigma2(noise.MAX_GAUSSIAN_SIGMA**2) >= noise.MAX_GAUSSIAN_SIGMA**2
    assert noise.discrete_gaussian(noise.MAX_GAUSSIAN_SIGMA**2, 1000).dtype == np.int64
    assert noise.discrete_laplace(noise.MAX_LAPLACE_SCALE, 1000).dtype == np.int64


BAD_PARAMETERS = [
    pytest.param(0, id="zero"),
    pytest.param(-1.0, id="negative"),
    pytest.param(Fraction(-1, 3), id="negative_fraction"),
    pytest.param(float("nan"), id="nan"),
    pytest.param(float("inf"), id="inf"),
    pytest.param(float("-inf"), id="minus_inf"),
    pytest.param("1", id="string"),
    pytest.param(None, id="none"),
    pytest.param(True, id="bool"),
]


@pytest.mark.parametrize("bad", BAD_PARAMETERS)
@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda v: noise.discrete_laplace(v, 10), id="discrete_laplace"),
        pytest.param(lambda v: noise.discrete_gaussian(v, 10), id="discrete_gaussian"),
        pytest.param(noise.used_laplace_scale, id="used_laplace_scale"),
        pytest.param(noise.used_gaussian_sigma2, id="used_gaussian_sigma2"),
        pytest.param(lambda v: noise.add_discrete_laplace(np.zeros(3, np.int64), v), id="add_lap"),
        pytest.param(lambda v: noise.add_discrete_gaussian(np.zeros(3, np.int64), v), id="add_gau"),
    ],
)
def test_invalid_parameters_raise(call: Callable[[object], object], bad: object) -> None:
    with pytest.raises(ConfigurationError):
        call(bad)


def test_too_large_parameters_raise_actionable_errors() -> None:
    with pytest.raises(ConfigurationError, match="too small to give a useful answer"):
        noise.discrete_laplace(noise.MAX_LAPLACE_SCALE + Fraction(1, 2), 10)
    with pytest.raises(ConfigurationError, match="too small to give a useful answer"):
        noise.discrete_gaussian(noise.MAX_GAUSSIAN_SIGMA**2 + 1, 10)


@pytest.mark.parametrize("size", [-1, 1.5, True, "3"])
def test_invalid_size_raises(size: object) -> None:
    with pytest.raises(ConfigurationError):
        noise.discrete_laplace(1, size)  # type: ignore[arg-type]


def test_zero_size() -> None:
    assert noise.discrete_laplace(1, 0).shape == (0,)
    assert noise.discrete_gaussian(1, 0).shape == (0,)


# --------------------------------------------------------------------------- add_* helpers


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint64])
def test_add_noise_keeps_shape_and_returns_int64(dtype: type) -> None:
    counts: np.ndarray = np.arange(12, dtype=dtype).reshape(3, 4)
    for out in (noise.add_discrete_laplace(counts, 2), noise.add_discrete_gaussian(counts, 4)):
        assert out.shape == (3, 4)
        assert out.dtype == np.int64
    assert noise.add_discrete_laplace([1, 2, 3], 1).dtype == np.int64  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "counts",
    [np.array([1.5, 2.0]), np.array([True, False]), np.array(["1"]), np.array([2**63], np.uint64)],
    ids=["float", "bool", "str", "uint64_overflow"],
)
def test_add_noise_rejects_non_integer_counts(counts: np.ndarray) -> None:
    with pytest.raises(ConfigurationError):
        noise.add_discrete_laplace(counts, 1)


def test_add_noise_is_counts_plus_independent_noise() -> None:
    counts = np.full(N_DRAWS, 1000, dtype=np.int64)
    diff = noise.add_discrete_laplace(counts, 10) - counts
    stat, threshold, _, _ = chi2_gof(diff, laplace_law(10), laplace_span(10))
    assert stat <= threshold


# --------------------------------------------------------------------------- FixedPoint


def test_fixed_point_for_bound_example() -> None:
    fp = noise.FixedPoint.for_bound(1000.0)
    assert fp.exponent == -6  # 1000 / 2**-6 = 64000 <= 65536 < 1000 / 2**-7
    assert fp.grid == Fraction(1, 64)
    assert fp.sensitivity_units(1000.0) == 64000
    assert noise.FixedPoint.for_bound(2.0**10, units=2**10).exponent == 0


@settings(max_examples=300, deadline=None)
@given(
    st.floats(min_value=1e-6, max_value=1e12, allow_nan=False),
    st.sampled_from([1, 7, 2**10, 2**16, 2**20]),
)
def test_fixed_point_grid_is_finest_that_fits(bound: float, units: int) -> None:
    fp = noise.FixedPoint.for_bound(bound, units)
    assert fp.sensitivity_units(bound) <= units
    assert Fraction(bound) / (fp.grid / 2) > units  # a grid twice finer would not fit
    assert noise.FixedPoint.for_bound(-bound, units) == fp


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=1e-3, max_value=1e9, allow_nan=False), st.floats(-1, 1))
def test_fixed_point_rounding_and_sensitivity(bound: float, frac: float) -> None:
    fp = noise.FixedPoint.for_bound(bound)
    x = frac * bound  # any value clamped to [-bound, bound]
    u = fp.to_units(x)
    assert isinstance(u, int)
    assert abs(u) <= fp.sensitivity_units(bound)
    assert abs(Fraction(fp.from_units(u)) - Fraction(x)) <= fp.grid / 2


def test_fixed_point_arrays_round_trip_exactly_on_the_grid() -> None:
    fp = noise.FixedPoint(exponent=-3)
    u = np.arange(-1000, 1001, dtype=np.int64)
    x = fp.from_units(u)
    assert isinstance(x, np.ndarray)
    np.testing.assert_array_equal(x, u / 8)
    np.testing.assert_array_equal(fp.to_units(x), u)
    assert fp.to_units(0.0625) == 0  # tie rounds to even
    assert fp.to_units(0.1875) == 2
    assert fp.from_units(3) == 0.375


@pytest.mark.parametrize("bad", [0, 0.0, float("nan"), float("inf"), "1", None])
def test_fixed_point_rejects_bad_bounds(bad: object) -> None:
    with pytest.raises(ConfigurationError):
        noise.FixedPoint.for_bound(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        noise.FixedPoint(0).sensitivity_units(bad)  # type: ignore[arg-type]


def test_fixed_point_rejects_bad_values() -> None:
    fp = noise.FixedPoint(0)
    with pytest.raises(ConfigurationError):
        fp.to_units(float("nan"))
    with pytest.raises(ConfigurationError):
        fp.to_units(np.array([1.0, float("inf")]))
    with pytest.raises(ConfigurationError):
        fp.to_units(1e30)
    with pytest.raises(ConfigurationError):
        noise.FixedPoint.for_bound(1.0, units=0)
    with pytest.raises(ConfigurationError):
        noise.FixedPoint(1.5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- accuracy: CI and std


def exact_coverage(mechanism: str, scale: float, k: int) -> float:
    """P(|Z| <= k), computed independently of dpsql.noise."""
    if mechanism == "discrete_laplace":
        return float(laplace_cdf(k, scale) - laplace_cdf(-k - 1, scale))
    return float(gaussian_cdf(k, scale**2) - gaussian_cdf(-k - 1, scale**2))


CONFIDENCES = [0.5, 0.9, 0.95, 0.99, 0.999999]


@pytest.mark.parametrize("confidence", CONFIDENCES)
@pytest.mark.parametrize(
    ("mechanism", "scale"),
    [("discrete_laplace", s) for s in (0.3, 1, 10, 1000)]
    + [("discrete_gaussian", s) for s in (0.5, 3, 200, 5000)],
)
def test_ci_halfwidth_is_smallest_covering_k(
    mechanism: str, scale: float, confidence: float
) -> None:
    k = noise.ci_halfwidth(mechanism, scale, confidence)
    assert k == int(k) >= 0
    assert exact_coverage(mechanism, scale, int(k)) >= confidence
    if k > 0:
        assert exact_coverage(mechanism, scale, int(k) - 1) < confidence


@pytest.mark.parametrize("scale", [0.3, 1, 10, 1000])
def test_laplace_ci_matches_closed_form(scale: float) -> None:
    for confidence in CONFIDENCES:
        k = int(noise.ci_halfwidth("discrete_laplace", scale, confidence))
        tail = 2 * math.exp(-(k + 1) / scale) / (1 + math.exp(-1 / scale))
        assert tail <= 1 - confidence


def test_gaussian_ci_normal_fallback_agrees_with_pmf_sum() -> None:
    boundary = noise._PMF_SUM_MAX_SIGMA
    for confidence in CONFIDENCES:
        summed = noise.ci_halfwidth("discrete_gaussian", boundary, confidence)
        normal = noise.ci_halfwidth("discrete_gaussian", boundary * (1 + 1e-12), confidence)
        assert abs(summed - normal) <= 1
    big = noise.ci_halfwidth("discrete_gaussian", 1e6, 0.95)
    assert big == math.ceil(1e6 * stats.norm.isf(0.025) - 0.5)


@pytest.mark.parametrize("confidence", [0.9, 0.99])
@pytest.mark.parametrize(
    ("mechanism", "scale"), [("discrete_laplace", 3.0), ("discrete_gaussian", 3.0)]
)
def test_ci_empirical_coverage(mechanism: str, scale: float, confidence: float) -> None:
    k = noise.ci_halfwidth(mechanism, scale, confidence)
    if mechanism == "discrete_laplace":
        draws = noise.discrete_laplace(scale, N_DRAWS)
    else:
        draws = noise.discrete_gaussian(scale**2, N_DRAWS)
    inside = int((np.abs(draws) <= k).sum())
    assert binomial_ok(inside, N_DRAWS, exact_coverage(mechanism, scale, int(k)))
    # and never significantly below the promised confidence (one-sided, same rate)
    assert (
        stats.binomtest(inside, N_DRAWS, confidence, alternative="less").pvalue
        >= FALSE_POSITIVE_RATE
    )


@pytest.mark.parametrize(
    ("mechanism", "scale"),
    [("discrete_laplace", s) for s in (0.3, 1, 10, 1000)]
    + [("discrete_gaussian", s) for s in (0.3, 0.5, 3, 200)],
)
def test_std_matches_pmf_and_draws(mechanism: str, scale: float) -> None:
    sd = noise.std(mechanism, scale)
    span = laplace_span(scale) if mechanism == "discrete_laplace" else gaussian_span(scale) * 4
    z = np.arange(-span, span + 1, dtype=np.float64)
    if mechanism == "discrete_laplace":
        pmf = np.diff(laplace_cdf(np.arange(-span - 1, span + 1), scale))
        draws = noise.discrete_laplace(scale, N_DRAWS)
    else:
        pmf = gaussian_pmf(z, scale**2)
        draws = noise.discrete_gaussian(scale**2, N_DRAWS)
    var = float((z**2 * pmf).sum())
    fourth = float((z**4 * pmf).sum())
    assert sd == pytest.approx(math.sqrt(var), rel=1e-9)
    # CLT z-test for E[Z^2] = var, two-sided at FALSE_POSITIVE_RATE
    zcrit = stats.norm.isf(FALSE_POSITIVE_RATE / 2)
    mean_sq = float((draws.astype(np.float64) ** 2).mean())
    assert abs(mean_sq - var) <= zcrit * math.sqrt((fourth - var**2) / N_DRAWS)


def test_std_large_scales() -> None:
    assert noise.std("discrete_gaussian", 1e6) == 1e6
    assert noise.std("discrete_laplace", 1e6) == pytest.approx(math.sqrt(2) * 1e6, rel=1e-9)


@pytest.mark.parametrize(
    "args",
    [
        ("laplace", 1.0, 0.9),
        ("discrete_laplace", 0.0, 0.9),
        ("discrete_laplace", 1.0, 1.0),
        ("discrete_gaussian", 1.0, 0.0),
        ("discrete_gaussian", float("nan"), 0.9),
    ],
    ids=["bad_mechanism", "zero_scale", "confidence_one", "confidence_zero", "nan_scale"],
)
def test_ci_halfwidth_rejects_bad_arguments(args: tuple[str, float, float]) -> None:
    with pytest.raises(ConfigurationError):
        noise.ci_halfwidth(*args)
