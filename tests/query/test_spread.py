"""VAR_POP, VAR_SAMP, STDDEV_POP, STDDEV_SAMP: noise scale, accuracy and intervals.

A spread aggregate measures three vectors, each with a third of the query's
cost: the sum of (x - m)^2 (m the bounds' midpoint, sensitivity h^2 with h half
the bounds' range), the sum of x - m (sensitivity h) and the count (1).

Noise scale: the stored noisy sums of squares of ~9,900 public cells minus the
exact sums (plain DuckDB) are the noise draws, checked as in test_noise_scale
(6 standard errors: a correct implementation fails with probability ~2e-9; the
scales 0.7x and 1.3x must be rejected).

Accuracy: the error bound is worked out here, independently of dpsql, from the
tails of the three noises: P(|Z| >= t) <= 2 exp(-t/b) for the discrete Laplace
of scale b, each at failure 1e-7, so a correct implementation fails a check with
probability <= 3e-7 (union bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import dpsql
import dpsql.policies
from dpsql.services import open_store
from dpsql.session import Session
from tests.conftest import ADULT_POLICY
from tests.query.conftest import plain, with_budgets
from tests.query.test_noise_scale import BAND, GRID, check_scale

EPSILON = 0.5
AGE_HALF = 42  # age is bounded to [0, 84]


@pytest.fixture
def pure_path(build: Callable[..., Path]) -> Path:
    return build(with_budgets(ADULT_POLICY, accounting="pure", budget={"epsilon": 1000},
                              cap={"epsilon": 100}, default={"epsilon": EPSILON}))


@pytest.fixture
def pure(pure_path: Path) -> Iterator[Session]:
    with dpsql.connect(pure_path, "alice") as session:
        yield session


def stored_measures(path: Path) -> list[np.ndarray]:
    """The noisy vectors of the one answer stored in the store (read as the test, not dpsql)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        rows = con.execute("SELECT measures FROM dpsql.query_cache").fetchall()
    finally:
        con.close()
    assert len(rows) == 1
    table = pa.ipc.open_stream(pa.py_buffer(bytes(rows[0][0]))).read_all()
    return [table.column(i).to_numpy() for i in range(table.num_columns)]


def test_sum_of_squares_noise_is_laplace_with_h_squared_over_a_third(pure_path: Path) -> None:
    sql = GRID.format(agg="VAR_POP(age)")
    with dpsql.connect(pure_path, "alice") as session:
        rows = session.sql(sql).table.to_pylist()
        exact_sql = GRID.format(agg=f"SUM((age - {AGE_HALF}) * (age - {AGE_HALF}))")
        exact = {(g, h): v for g, h, v in plain(session, exact_sql)}
    squares = stored_measures(pure_path)[0]  # the measures in order: squares, sum, count
    truth = np.array([exact.get((r["g"], r["h"])) or 0 for r in rows], dtype=float)
    draws = squares - truth
    check_scale(draws, "discrete_laplace", AGE_HALF**2 / (EPSILON / 3))


def laplace_tail(scale: float, failure: float) -> float:
    """t with P(|Z| >= t) <= failure for a discrete Laplace of ``scale``."""
    return scale * math.log(2 / failure)


def spread_error_bound(n: float, s1: float, s2: float, epsilon: float, half: float) -> float:
    """The largest |var_pop(noisy) - var_pop(true)| when each part's noise is within its tail.

    var_pop = S2/n - (S1/n)^2 is monotone in each part over the box (n > 0 far from 0),
    so its extremes are at the box's corners.
    """
    tails = [laplace_tail(sens / (epsilon / 3), 1e-7) for sens in (half**2, half, 1)]
    truth = s2 / n - (s1 / n) ** 2
    worst = 0.0
    for d2 in (-1, 1):
        for d1 in (-1, 1):
            for dn in (-1, 1):
                nn = n + dn * tails[2]
                value = (s2 + d2 * tails[0]) / nn - ((s1 + d1 * tails[1]) / nn) ** 2
                worst = max(worst, abs(value - truth))
    return worst


@pytest.mark.parametrize("epsilon", [1.0, 5.0, 20.0])
def test_variance_and_stddev_are_within_the_noise_bound(pure: Session, epsilon: float) -> None:
    answer = pure.sql(f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = {epsilon}) "
                      "VAR_POP(age) AS vp, VAR_SAMP(age) AS vs, STDDEV_POP(age) AS sp, "
                      "STDDEV_SAMP(age) AS ss FROM adult")
    row = answer.table.to_pylist()[0]
    (n, s1, s2, vp, vs), = plain(pure, f"SELECT COUNT(age), SUM(age - {AGE_HALF}), "
                                 f"SUM((age - {AGE_HALF}) ** 2), VAR_POP(age), VAR_SAMP(age) "
                                 "FROM adult")
    bound = spread_error_bound(n, s1, s2, epsilon, AGE_HALF)
    assert abs(row["vp"] - vp) <= bound
    assert abs(row["vs"] - vs) <= bound * n / (n - 1) + vs / (n - 1)
    assert row["sp"] == pytest.approx(math.sqrt(row["vp"]))
    assert row["ss"] == pytest.approx(math.sqrt(row["vs"]))
    assert bound < vp / 2  # the check has teeth: the noise is small against the value
    spent = answer.cost.value
    assert spent == Fraction(str(epsilon))  # one charge for the four aggregates


def test_intervals_cover_the_truth(pure: Session) -> None:
    """95% intervals of VAR_POP, VAR_SAMP and STDDEV_POP over 45 groups at 20 costs.

    Each interval misses with probability <= 0.05 (a box of three 1 - 0.05/3
    intervals, union bound), so misses among the 900 per aggregate are at most
    Binomial(900, 0.05): the bound is 6 standard deviations above its mean (FP ~1e-9).
    """
    pure.sql("SET dpsql.ci = 0.95")
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = {eps}) relationship, race, "
           "dp_bin(age, 30) AS a, VAR_POP(hours_per_week) AS vp, "
           "VAR_SAMP(hours_per_week) AS vs, STDDEV_POP(hours_per_week) AS sp "
           "FROM adult GROUP BY 1, 2, 3")
    exact = {r[:3]: r[3:] for r in plain(pure, sql.replace(
        "WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = {eps}) ", "").replace(
        "dp_bin(age, 30)", "30 * floor(age / 30)"))}
    misses = dict.fromkeys(("vp", "vs", "sp"), 0)
    total = 0
    for i in range(20):
        for row in pure.sql(sql.format(eps=2 + i / 10)).table.to_pylist():
            truth = exact.get((row["relationship"], row["race"], row["a"]), (None,) * 3)
            for name, value in zip(("vp", "vs", "sp"), truth, strict=True):
                low, high = row[f"{name}_ci_low"], row[f"{name}_ci_high"]
                if value is not None and low is not None:
                    total += name == "vp"
                    misses[name] += not low - 1e-9 <= value <= high + 1e-9
    assert total > 300
    limit = 0.05 * total + BAND * math.sqrt(total * 0.05 * 0.95)
    assert max(misses.values()) <= limit, misses


def test_clamped_to_what_the_bounds_allow(pure: Session) -> None:
    """A group with no rows: the count may be noisy above 1, but the variance stays in [0, h^2]."""
    rows = pure.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.01) "
                    "VAR_POP(age) AS v, STDDEV_POP(age) AS s FROM adult WHERE age > 500 "
                    "GROUP BY sex, race").table.to_pylist()
    values = [r["v"] for r in rows if r["v"] is not None]
    assert all(0 <= v <= AGE_HALF**2 for v in values)
    assert all(0 <= r["s"] <= AGE_HALF for r in rows if r["s"] is not None)


def test_explain_states_the_split(pure: Session) -> None:
    answer = pure.sql("EXPLAIN PRIVACY SELECT VAR_SAMP(age), AVG(age) FROM adult")
    parts = answer.table.column("aggregate").to_pylist()
    assert parts == ["VAR_SAMP(age) [squares]", "VAR_SAMP(age) [sum]", "VAR_SAMP(age) [count]",
                     "AVG(age) [sum]", "AVG(age) [count]"]
    assert "split equally over 3 measurement(s)" in (answer.notice or "")  # AVG shares two
    scales = answer.table.column("scale").to_pylist()
    assert scales[:3] == pytest.approx([AGE_HALF**2 * 3 / EPSILON, AGE_HALF * 3 / EPSILON,
                                        3 / EPSILON], rel=1e-6)


def test_wide_and_float_columns_are_exact_without_noise(tmp_path: Path) -> None:
    """A column whose range squared passes BIGINT is squared in DOUBLE on a coarse grid
    (2**50 per unit here): its totals must not overflow (they did in int64). Values
    outside the bounds are clamped, as the reference does by hand."""
    from tests.query.conftest import table_policy

    policy = tmp_path / "p.yaml"
    policy.write_text(table_policy("      x: {type: integer, bounds: [-1099511627776, "
                                   "1099511627775]}\n      y: {type: float, bounds: [-3.5, 10]}"))
    path = tmp_path / "wide.duckdb"
    with open_store(path, create=True) as store, store.transaction() as cur:
        cur.execute("CREATE TABLE main.t AS SELECT (i * 7919 * 1000003) % 2000000000000 "
                    "- 1000000000000 AS x, (i % 97) / 7.0 - 3 AS y FROM range(10000) r(i)")
    with open_store(path) as store:
        dpsql.policies.apply_policy(store, dpsql.policy.Policy.load(policy), "admin")
    with dpsql.connect(path, "admin") as session:
        got = session.sql("SELECT VAR_POP(x), STDDEV_SAMP(y), VAR_SAMP(y) FROM t").table
        (expected,) = session.store.cursor().execute(
            "SELECT VAR_POP(x), STDDEV_SAMP(least(y, 10)), VAR_SAMP(least(y, 10)) FROM t"
        ).fetchall()
    assert list(got.to_pylist()[0].values()) == pytest.approx(expected, rel=1e-6)
