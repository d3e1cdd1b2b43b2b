"""Answers that say when they are noise, non-negative counts, and the cost for a target error.

Statistical claims: a true count of 0 gets a noisy value inside its own interval
(hence flagged) with probability >= the confidence, set to 1 - 1e-6 here; a count
of 5,000 at epsilon 1 is flagged only if its noise exceeds its half-width
(~4), whose probability is below 1e-300.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dpsql
from dpsql.session import Session
from tests.conftest import ADULT_POLICY
from tests.query.conftest import with_budgets

SURE = "SET dpsql.ci = 0.999999"
NOTHING = "SELECT COUNT(*) AS n FROM adult WHERE age > 500"  # the true count is 0


@pytest.fixture(params=["pure", "zcdp"])
def analyst(request: pytest.FixtureRequest, build: Callable[..., Path]) -> Iterator[Session]:
    budget = {"epsilon": 1000} if request.param == "pure" else {"rho": 1000}
    cap = {"epsilon": 100} if request.param == "pure" else {"rho": 100}
    path = build(with_budgets(ADULT_POLICY, accounting=request.param, budget=budget, cap=cap,
                              default={"epsilon": 1}))
    with dpsql.connect(path, "alice") as session:
        yield session


def test_a_tiny_count_is_flagged_and_a_huge_one_is_not(analyst: Session) -> None:
    analyst.sql(SURE)
    tiny = analyst.sql(NOTHING)
    assert tiny.noise_dominated == {"n": [True]}
    assert tiny.warning is not None
    assert "n in 1 of 1 row(s)" in tiny.warning
    assert "0.999999" in tiny.warning
    huge = analyst.sql("SELECT COUNT(*) AS n, SUM(age) AS s FROM adult")
    assert huge.noise_dominated == {"n": [False], "s": [False]}
    assert huge.warning is None


def test_flags_follow_the_rows_through_having_and_order(analyst: Session) -> None:
    analyst.sql(SURE)
    answer = analyst.sql("SELECT sex, COUNT(*) FILTER (WHERE age > 500 OR sex = 1) AS n "
                         "FROM adult GROUP BY sex ORDER BY sex DESC")
    assert answer.table.column("sex").to_pylist() == [1, 0]
    assert answer.noise_dominated["n"] == [False, True]  # sex = 0 counts nobody
    assert "n in 1 of 2 row(s)" in (answer.warning or "")


def test_a_null_or_wide_average_and_variance_are_flagged(analyst: Session) -> None:
    analyst.sql(SURE)
    answer = analyst.sql("SELECT AVG(age) AS a, VAR_POP(age) AS v, STDDEV_SAMP(age) AS s "
                         "FROM adult WHERE age > 500")
    assert answer.noise_dominated == {"a": [True], "v": [True], "s": [True]}
    clear = analyst.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 50) AVG(age) AS a, "
                        "VAR_POP(age) AS v FROM adult")
    assert clear.noise_dominated == {"a": [False], "v": [False]}


def test_the_flag_matches_the_shown_interval(analyst: Session) -> None:
    """Flagged exactly where |value| < half the width of the interval shown (COUNT)."""
    analyst.sql("SET dpsql.ci = 0.9")
    answer = analyst.sql("SELECT dp_bin(age, 1) AS a, COUNT(*) AS n FROM adult GROUP BY 1")
    rows = answer.table.to_pylist()
    expected = [abs(r["n"]) < (r["n_ci_high"] - r["n_ci_low"]) / 2 or r["n"] < 0 for r in rows]
    assert answer.noise_dominated["n"] == expected
    assert 0 < sum(expected) < len(rows)  # ages 0-16 hold nobody; the adults many


def test_nonnegative_counts(analyst: Session) -> None:
    sql = "SELECT dp_bin(age, 1) AS a, dp_bin(hours_per_week, 1) AS h, COUNT(*) AS n " \
          "FROM adult GROUP BY 1, 2"
    analyst.sql("SET dpsql.ci = 0.95")
    raw = analyst.sql(sql).table
    unbiased = raw.column("n").to_pylist()
    assert min(unbiased) < 0  # most of the 8,415 cells are empty: about half go negative
    analyst.sql("SET dpsql.nonnegative_counts = on")
    clipped = analyst.sql(sql)  # the same stored measures: a repeat, free
    assert clipped.cost.is_zero
    assert clipped.table.column("n").to_pylist() == [max(0, n) for n in unbiased]
    assert clipped.table.column("n_ci_low").to_pylist() == \
        [max(0, n) for n in raw.column("n_ci_low").to_pylist()]
    assert clipped.noise_dominated["n"] == analyst.sql(sql.replace(
        "COUNT(*) AS n", "COUNT(*) AS n")).noise_dominated["n"]
    analyst.sql("SET dpsql.nonnegative_counts = off")
    assert analyst.sql(sql).table.column("n").to_pylist() == unbiased
    with pytest.raises(dpsql.ConfigurationError):
        analyst.sql("SET dpsql.nonnegative_counts = maybe")


def _suggested(notice: str, unit: str) -> str:
    found = re.search(rf"SET dpsql\.{unit} = ([0-9.e-]+)", notice)
    assert found is not None, notice
    return found.group(1)


@pytest.mark.parametrize("target", [10, 250])
def test_explain_suggests_the_least_cost_for_a_target_error(analyst: Session,
                                                             target: int) -> None:
    query = "SELECT COUNT(*), SUM(age), VAR_POP(hours_per_week) FROM adult"
    unit = "epsilon" if analyst.policy.accounting == "pure" else "rho"
    analyst.sql(f"SET dpsql.target_error = {target}")
    explained = analyst.sql(f"EXPLAIN PRIVACY {query}")
    cost = _suggested(explained.notice or "", unit)
    assert explained.table.column("suggested_cost").null_count == 0
    analyst.sql(f"SET dpsql.{unit} = {cost}")
    widths = analyst.sql(f"EXPLAIN PRIVACY {query}").table.column("ci_halfwidth").to_pylist()
    assert max(widths) <= target
    analyst.sql(f"SET dpsql.{unit} = {float(cost) * 0.98!r}")
    widths = analyst.sql(f"EXPLAIN PRIVACY {query}").table.column("ci_halfwidth").to_pylist()
    assert max(widths) > target  # the suggestion is (nearly) the least that meets it


def test_a_target_error_must_be_positive(analyst: Session) -> None:
    with pytest.raises(dpsql.ConfigurationError):
        analyst.sql("SET dpsql.target_error = -3")


def test_the_cli_prints_the_noise_line(build: Callable[..., Path]) -> None:
    path = build(with_budgets(ADULT_POLICY, accounting="pure", budget={"epsilon": 10},
                              cap={"epsilon": 1}, default={"epsilon": 1}))
    script = f"{SURE};\n{NOTHING};\n"
    done = subprocess.run([sys.executable, "-m", "dpsql", "query", "-f", "-", "--db", str(path),
                           "--user", "alice"], input=script, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "dpsql: mostly noise at 0.999999 confidence: n in 1 of 1 row(s)" in done.stderr


def test_without_noise_nothing_is_flagged(exact_adult: Session) -> None:
    """An unbounded budget adds no noise: an empty group's NULL average is not noise."""
    answer = exact_adult.sql("SELECT AVG(age) AS a, COUNT(*) AS n FROM adult WHERE age > 500")
    assert answer.table.to_pylist() == [{"a": None, "n": 0}]
    assert answer.noise_dominated == {"a": [False], "n": [False]}
    assert answer.warning is None
