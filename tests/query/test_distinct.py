"""COUNT(DISTINCT col): exact on the bounded rows, COUNT(*)'s noise, accuracy and an audit.

One privacy unit keeps at most ``max_rows`` rows, and each kept row adds at most
one distinct value to its cell, so a distinct count has COUNT(*)'s sensitivity.
Statistical tests state their false-positive rate; the noise is seeded per test
(tests/query/conftest.py), so a run is reproducible.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import beta

import dpsql
from dpsql import noise
from dpsql.engines.local import _DuckDBPrepared
from dpsql.engines.source import bounded_sql
from dpsql.imports import table_columns
from dpsql.mechanisms.additive import Noise
from dpsql.policy import Column
from dpsql.privacy import PrivacyCost
from dpsql.query.dialect import DIALECT
from dpsql.query.planner import plan_query
from dpsql.query.post import distinct_ceiling
from dpsql.query.render import Context, calibrate
from dpsql.session import Session
from tests.conftest import ADULT_POLICY
from tests.query.conftest import charges, plain, with_budgets
from tests.query.test_noise_scale import check_scale

MAX_ROWS = 2
POLICY = """version: 1
accounting: pure
datasets:
  t:
    table: t
    privacy_unit: person
    max_rows: {max_rows}
    budget: {{epsilon: {budget}}}
    query_cap: {{epsilon: {budget}}}
    default_query: {{epsilon: {epsilon}}}
    columns:
      person: {{type: hidden}}
      g: {{type: categorical, values: [a, b]}}
      x: {{type: integer, bounds: [0, 1000]}}
users:
  admin: {{role: admin, budgets: {{t: {{epsilon: {budget}}}}}}}
  alice: {{role: analyst, budgets: {{t: {{epsilon: {budget}}}}}}}
"""


def _people(rows_each: int = 5, people: int = 40) -> list[tuple[int, str, int]]:
    """Each person has ``rows_each`` rows with values of their own (some shared)."""
    rng = np.random.default_rng(7)
    return [(p, "ab"[p % 2], int(rng.integers(0, 300))) for p in range(people)
            for _ in range(rows_each)]


def _store(build: Callable[..., Path], tmp_path: Path, rows: list[tuple[int, str, int]],
           name: str, epsilon: str = ".inf", budget: str = ".inf") -> Path:
    """A store over ``rows``; by default with unbounded budgets (answers without noise)."""
    data = tmp_path / f"{name}.csv"
    with data.open("w", newline="") as handle:
        csv.writer(handle).writerows([("person", "g", "x"), *rows])
    return build(POLICY.format(max_rows=MAX_ROWS, budget=budget, epsilon=epsilon),
                 data={"t": data})


def _bounded(session: Session, sql: str) -> list[tuple[object, ...]]:
    """``sql`` over the bounded rows (``{src}``), run with plain DuckDB on the store."""
    dataset = session.policy.datasets["t"]
    source = bounded_sql(dataset, session.store.secret)
    return session.store.cursor().sql(sql.format(src=source)).fetchall()


# -- exact (unbounded budget) --------------------------------------------------------------------


def test_without_noise_it_is_duckdbs_distinct_count_on_the_bounded_rows(
        build: Callable[..., Path], tmp_path: Path) -> None:
    with dpsql.connect(_store(build, tmp_path, _people(), "t"), "alice") as alice:
        got = alice.sql("SELECT g, COUNT(DISTINCT x) AS n, COUNT(DISTINCT x) FILTER "
                        "(WHERE x < 100) AS low FROM t GROUP BY g ORDER BY g").table.to_pylist()
        kept = _bounded(alice, "SELECT person, count(*) FROM {src} GROUP BY person")
        reference = _bounded(alice, "SELECT g, count(DISTINCT x), count(DISTINCT x) FILTER "
                             "(WHERE x < 100) FROM {src} GROUP BY g ORDER BY g")
        raw = _bounded(alice, "SELECT g, count(DISTINCT x) FROM t GROUP BY g ORDER BY g")
    assert max(n for _, n in kept) == MAX_ROWS
    assert [(r["g"], r["n"], r["low"]) for r in got] == reference
    assert [n for _, n in raw] > [n for _, n, _ in reference]  # the bounding dropped values


def test_without_noise_on_adult_grouped_and_filtered(exact_adult: Session) -> None:
    dp = ("SELECT sex, COUNT(DISTINCT age), COUNT(DISTINCT hours_per_week) FILTER "
          "(WHERE race = 0), COUNT(DISTINCT workclass) FROM adult WHERE age > 30 GROUP BY sex "
          "ORDER BY sex")
    got = [tuple(r.values()) for r in exact_adult.sql(dp).table.to_pylist()]
    assert got == plain(exact_adult, dp)


# -- the noise: COUNT(*)'s sensitivity, scale and notices ----------------------------------------


def _laplace(sensitivity: int, epsilon: Fraction) -> float:
    return float(noise.used_laplace_scale(Fraction(sensitivity) / epsilon))


def test_explain_privacy_shows_count_stars_noise(build: Callable[..., Path],
                                                 tmp_path: Path) -> None:
    path = _store(build, tmp_path, _people(), "t", epsilon="0.5", budget="5")
    with dpsql.connect(path, "alice") as alice:
        rows = alice.sql("EXPLAIN PRIVACY SELECT COUNT(*), COUNT(DISTINCT x) FROM t"
                         ).table.to_pylist()
        assert charges(alice) == 0
    count, distinct = rows
    assert distinct["aggregate"] == "COUNT(DISTINCT x)"
    assert distinct["mechanism"] == count["mechanism"] == "discrete_laplace"
    assert distinct["scale"] == count["scale"] == _laplace(MAX_ROWS, Fraction(1, 4))
    assert distinct["cost"].startswith("epsilon=0.25")


def test_the_charge_comes_before_duckdb_reads_a_row(
        build: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = _DuckDBPrepared.run

    def run(self: _DuckDBPrepared) -> object:
        seen.append(charges(alice))
        return real(self)

    monkeypatch.setattr(_DuckDBPrepared, "run", run)
    path = _store(build, tmp_path, _people(), "t", epsilon="1", budget="5")
    with dpsql.connect(path, "alice") as alice:
        alice.sql("SELECT g, COUNT(DISTINCT x) FROM t GROUP BY g")
        assert seen == [1]


GRID = ("SELECT dp_bin(capital_gain, 1) AS g, dp_bin(hours_per_week, 1) AS h, "
        "COUNT(DISTINCT age) AS v FROM adult GROUP BY 1, 2")
BOUNDED_GRID = ("SELECT capital_gain, hours_per_week, count(DISTINCT age) FROM {src} "
                "GROUP BY 1, 2")


def test_noise_scale_is_max_rows_over_epsilon(build: Callable[..., Path]) -> None:
    """~9,900 cells, each noisy minus exact on the bounded rows: the variance of the draws
    is the discrete Laplace's at scale 3 / 0.5, not at 0.7x or 1.3x (so not at the scale
    of sensitivity 1 either); false-positive rate ~2e-9 (tests/query/test_noise_scale.py)."""
    text = with_budgets(ADULT_POLICY, accounting="pure", budget={"epsilon": 10},
                        cap={"epsilon": 1}, default={"epsilon": 0.5}, unit="fnlwgt",
                        max_rows=3)
    with dpsql.connect(build(text), "alice") as alice:
        rows = alice.sql(GRID).table.to_pylist()
        source = bounded_sql(alice.policy.datasets["adult"], alice.store.secret)
        exact = {(g, h): n for g, h, n in alice.store.cursor().sql(
            BOUNDED_GRID.format(src=source)).fetchall()}
    assert len(rows) == 100 * 99  # every public cell, empty ones included
    draws = np.array([r["v"] - exact.get((r["g"], r["h"]), 0) for r in rows], dtype=float)
    check_scale(draws, "discrete_laplace", 3 / 0.5)


def test_accuracy_within_the_interval(build: Callable[..., Path], tmp_path: Path) -> None:
    """At epsilon 1 (scale 2), each of the 2 cells is off by more than its 1 - 1e-7
    half-width with probability at most 1e-7: a false failure has probability < 2e-7."""
    path = _store(build, tmp_path, _people(), "t", epsilon="1", budget="5")
    with dpsql.connect(path, "alice") as alice:
        alice.sql("SET dpsql.ci = 0.9999999")
        answer = alice.sql("SELECT g, COUNT(DISTINCT x) AS n FROM t GROUP BY g ORDER BY g")
        exact = _bounded(alice, "SELECT g, count(DISTINCT x) FROM {src} GROUP BY g ORDER BY g")
    half = noise.ci_halfwidth("discrete_laplace", _laplace(MAX_ROWS, Fraction(1)), 0.9999999)
    rows = answer.table.to_pylist()
    assert [(r["n_ci_high"] - r["n_ci_low"]) / 2 for r in rows] == [half, half]
    assert all(abs(r["n"] - n) <= half for r, (_, n) in zip(rows, exact, strict=True))


def test_notices_and_nonnegative_counts(build: Callable[..., Path], tmp_path: Path) -> None:
    """A distinct count of 0 falls inside its own 1 - 1e-6 interval (flagged) with
    probability >= 1 - 1e-6; non-negative counts clip it at 0."""
    path = _store(build, tmp_path, _people(), "t", epsilon="0.1", budget="5")
    sql = "SELECT COUNT(DISTINCT x) FILTER (WHERE x > 500) AS n FROM t"  # x < 300: true 0
    with dpsql.connect(path, "alice") as alice:
        alice.sql("SET dpsql.ci = 0.999999")
        answer = alice.sql(sql)
        assert answer.noise_dominated == {"n": [True]}
        assert "n in 1 of 1 row(s)" in (answer.warning or "")
        alice.sql("SET dpsql.nonnegative_counts = on")
        clipped = alice.sql(sql)  # a repeat: the same noisy measure, free
    assert clipped.cost.is_zero
    assert clipped.table.column("n").to_pylist() == [max(0, answer.table["n"][0].as_py())]


def test_a_distinct_count_is_at_most_its_declared_domain(build: Callable[..., Path],
                                                        tmp_path: Path) -> None:
    """g declares 2 values: at scale 20 (epsilon 0.1), each of 101 cells' noisy distinct
    count of g exceeds 2 with probability about 1/2 before the clamp, so all 101 at most 2
    without it has probability about 1e-30; with it, every value and interval bound is."""
    path = _store(build, tmp_path, _people(), "t", epsilon="0.1", budget="5")
    sql = "SELECT dp_bin(x, 10) AS b, COUNT(DISTINCT g) AS n FROM t GROUP BY b"
    with dpsql.connect(path, "alice") as alice:
        alice.sql("SET dpsql.ci = 0.95")
        table = alice.sql(sql).table
    assert table.num_rows == 101  # bins 0, 10, ..., 1000
    for column in ("n", "n_ci_low", "n_ci_high"):
        assert max(table.column(column).to_pylist()) <= 2
    assert distinct_ceiling(Column("x", "integer", bounds=(0.5, 10.0))) == 10
    assert distinct_ceiling(Column("g", "categorical", values=("a", "b", None))) == 2
    assert distinct_ceiling(Column("f", "float", bounds=(0.0, 1.0))) is None


# -- empirical privacy audit ----------------------------------------------------------------------

BASE = [(1, "a", 1), (1, "a", 2), (2, "a", 2), (3, "b", 5)]
ADDED = [(9, "a", 7), (9, "a", 8), (9, "a", 9)]  # new values: max_rows of them are kept


def _neighbours(build: Callable[..., Path], tmp_path: Path, epsilon: str
                ) -> tuple[int, int, Noise]:
    """The exact distinct counts of two neighbouring tables and the noise a query gets."""
    sql = "SELECT COUNT(DISTINCT x) FROM t"
    exact = []
    for name, rows in (("base", BASE), ("added", BASE + ADDED)):
        path = _store(build, tmp_path, rows, f"{name}_{epsilon}")
        with dpsql.connect(path, "alice") as alice:
            exact.append(alice.sql(sql).table.column(0)[0].as_py())
            types = table_columns(alice.store, "t")
            policy = alice.policy
    plan = plan_query(DIALECT.parse(sql)[0], sql, policy, lambda _: types)
    (noise_,) = calibrate(plan, PrivacyCost.pure(Fraction(epsilon)), "pure",
                          Context("secret", types))
    assert isinstance(noise_, Noise)
    return exact[0], exact[1], noise_


def _epsilon_lower_bound(base: int, added: int, noise_: Noise, runs: int) -> float:
    """The 95% Clopper-Pearson lower bound on epsilon from ``runs`` releases of each table.

    The event "the release is at most ``base``" is fixed before sampling; its
    probabilities differ by the whole loss when the counts differ by the
    sensitivity. Each side's bound holds at 97.5%, so both together at 95%.
    """
    hits = [int((noise_.release(np.full(runs, count)) <= base).sum()) for count in (base, added)]
    low = beta.ppf(0.025, hits[0], runs - hits[0] + 1)
    high = beta.ppf(0.975, hits[1] + 1, runs - hits[1])
    return math.log(low / high)


def test_the_audit_bound_does_not_exceed_the_claim(build: Callable[..., Path],
                                                   tmp_path: Path) -> None:
    """Neighbouring tables whose distinct counts differ by max_rows (the worst case), 200,000
    releases each (0.2 s): the bound exceeds epsilon 1 with probability < 5% if the claim
    holds (this pair's true loss is exactly 1; the bound came out 0.99); noise calibrated
    for epsilon 2, as a sensitivity of 1 instead of max_rows would give, makes it about 2."""
    base, added, noise_ = _neighbours(build, tmp_path, "1")
    assert added - base == MAX_ROWS
    assert _epsilon_lower_bound(base, added, noise_, 200_000) <= 1.0
    *_, too_little = _neighbours(build, tmp_path, "2")
    assert _epsilon_lower_bound(base, added, too_little, 200_000) > 1.0

