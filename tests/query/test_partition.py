"""GROUP BY a categorical column with no value list: keys released by DP partition selection."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

import dpsql
from dpsql.mechanisms.additive import Noise
from dpsql.policy import Column, Dataset
from dpsql.privacy import PrivacyCost, epsilon_from_rho
from dpsql.query import dp as answer_module
from dpsql.query.model import GroupKey, QueryPlan
from dpsql.query.planner import plan_query
from dpsql.query.selection import (
    COUNT_ROWS,
    Selection,
    leak_bound,
    select_keys,
    selection_delta,
    threshold,
)
from dpsql.query.statement import QueryStatement, classify
from dpsql.session import Session
from tests.query.conftest import charges

#: Chance that a correct implementation fails one of the statistical tests below.
TEST_FAILURE_RATE = 1e-6
#: Units per key of the test table: NULL is a key like any other; "lonely" has one unit.
UNITS = {"big": 300, "mid": 200, None: 50, "lonely": 1}


def _policy(accounting: str, budget: str, max_rows: int = 1, query: str | None = None) -> str:
    kind = "rho" if accounting == "zcdp" and budget != ".inf" else "epsilon"
    query = query or budget
    delta = "delta: 1.0e-6\n" if accounting == "zcdp" else ""
    return f"""version: 1
accounting: {accounting}
{delta}datasets:
  t:
    table: t
    max_rows: {max_rows}
    budget: {{{kind}: {budget}}}
    query_cap: {{{kind}: {query}}}
    default_query: {{{kind}: {query}}}
    columns:
      zip: {{type: categorical}}
      hours: {{type: integer, bounds: [0, 100]}}
users:
  alice: {{role: analyst, budgets: {{t: {{{kind}: {budget}}}}}}}
  admin: {{role: admin, budgets: {{t: {{{kind}: {budget}}}}}}}
"""


def _store(directory: Path, policy: str) -> Path:
    data = directory / "t.csv"
    with data.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["zip", "hours"])
        for key, units in UNITS.items():
            writer.writerows([[key if key is not None else "", 40]] * units)
    (directory / "p.yaml").write_text(policy)
    store, _ = dpsql.init(directory / "s.duckdb", directory / "p.yaml", {"t": data})
    store.close()
    return directory / "s.duckdb"


@pytest.fixture
def open_keys(tmp_path: Path) -> Iterator[Session]:
    """Alice under zcdp (delta 1e-6) at rho 0.5 a query of the dataset's 2, on a table whose
    ``zip`` has no list: a selection spends a quarter of the policy's delta."""
    with dpsql.connect(_store(tmp_path, _policy("zcdp", "2", query="0.5")), "alice") as session:
        yield session


def _gauss(rho: Fraction) -> Noise:
    return Noise.calibrate("zcdp", 1, 0, PrivacyCost.zcdp(rho))


# -- the threshold ---------------------------------------------------------------------


@pytest.mark.parametrize("max_rows", [1, 3, 20])
@pytest.mark.parametrize("delta", [1e-6, 0.05])
def test_the_threshold_is_the_least_that_bounds_the_leak_by_delta(max_rows: int,
                                                                  delta: float) -> None:
    noise = _gauss(Fraction(1, 4))
    tau = threshold(noise, max_rows, delta)
    assert leak_bound(noise, max_rows, tau) <= delta
    assert leak_bound(noise, max_rows, tau - 1) > delta


def _lonely_release_rate(tau: int, max_rows: int, keys: int) -> int:
    """How many of ``keys`` keys, each held by one unit's ``max_rows`` rows, are released."""
    noise = _gauss(Fraction(1, 2))
    sparse = pa.table({"_k0": pa.array([f"k{i}" for i in range(keys)]),
                       "_m0": pa.array(np.full(keys, max_rows), pa.int64())})
    plan = _plan_stub()
    released, _ = select_keys(plan, sparse, (noise,), Selection(0, tau, 0.0))
    return released.keys[0].size


def _plan_stub() -> QueryPlan:
    """A plan with one selected key and COUNT(*) as its one measure."""
    zero = PrivacyCost.zero("zcdp")
    dataset = Dataset("t", "t", {"zip": Column("zip", "categorical")}, zero, None, None)
    return QueryPlan(dataset, (GroupKey("zip", "selected", ()),), (COUNT_ROWS,), (), None, ())


def _plan(session: Session, sql: str) -> QueryPlan:
    statement = classify(sql)
    assert isinstance(statement, QueryStatement)
    types = {"zip": "VARCHAR", "hours": "BIGINT"}
    return plan_query(statement.ast, sql, session.policy, lambda ds: types)


@pytest.mark.parametrize("max_rows", [1, 3])
def test_a_key_held_by_one_unit_is_released_with_probability_at_most_delta(
        max_rows: int) -> None:
    """200,000 independent lonely keys; the count released is Binomial(n, p <= delta).

    The bound is the binomial's upper (1 - TEST_FAILURE_RATE) quantile at p = delta. A
    threshold half as high releases far more than that (checked below, so the test has
    the power to see a miscomputed tau).
    """
    delta, keys = 0.01, 200_000
    tau = threshold(_gauss(Fraction(1, 2)), max_rows, delta)
    limit = stats.binom.isf(TEST_FAILURE_RATE, keys, delta)
    assert _lonely_release_rate(tau, max_rows, keys) <= limit
    assert _lonely_release_rate(tau // 2, max_rows, keys) > limit


# -- through the session ---------------------------------------------------------------


def test_keys_with_many_units_are_released_with_their_counts(open_keys: Session) -> None:
    """At rho 0.5 a COUNT has sigma 1: a key of 50 units misses tau (< 10) with p < 1e-9."""
    answer = open_keys.sql("SELECT zip, COUNT(*) AS n FROM t GROUP BY zip")
    rows = answer.table.to_pylist()
    assert [r["zip"] for r in rows] == ["big", "mid", None]  # sorted, NULL last
    for row in rows:
        assert abs(row["n"] - UNITS[row["zip"]]) <= 6  # 6 sigma: P(fail) < 2e-9 a row
    assert answer.columns["zip"]["public"] is False
    assert "plus delta=2.5e-07" in (answer.notice or "")


def test_with_an_unbounded_budget_every_key_present_is_released_exactly(
        tmp_path: Path) -> None:
    with dpsql.connect(_store(tmp_path, _policy("zcdp", ".inf")), "alice") as session:
        rows = session.sql("SELECT zip, COUNT(*), SUM(hours) FROM t GROUP BY zip").table
    assert rows.to_pylist() == [
        {"zip": k, "count": n, "sum_hours": 40 * n}
        for k, n in sorted(UNITS.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))]


def test_count_star_reuses_the_selection_and_other_aggregates_add_it(
        open_keys: Session) -> None:
    plan = _plan(open_keys, "SELECT zip, COUNT(*) FROM t GROUP BY zip")
    assert plan.measures == (COUNT_ROWS,)
    plan = _plan(open_keys, "SELECT zip, SUM(hours) FROM t GROUP BY zip")
    assert plan.measures[-1] == COUNT_ROWS
    assert len(plan.measures) == 2


def test_explain_privacy_shows_tau_and_delta_at_no_cost(open_keys: Session) -> None:
    before = charges(open_keys)
    explained = open_keys.sql("EXPLAIN PRIVACY SELECT zip, SUM(hours) FROM t GROUP BY zip")
    selection = explained.table.to_pylist()[-1]
    tau = threshold(_gauss(Fraction(1, 4)), 1, 2.5e-7)
    assert selection["aggregate"] == f"partition selection [COUNT(*) >= {tau}]"
    assert selection["cost"].endswith("plus delta=2.5e-07")
    assert "partition selection" in (explained.notice or "")
    assert charges(open_keys) == before


def test_a_repeat_gets_the_same_keys_and_numbers_from_the_cache(open_keys: Session) -> None:
    sql = "SELECT zip, COUNT(*), AVG(hours) FROM t GROUP BY zip"
    first = open_keys.sql(sql)
    again = open_keys.sql(sql)
    assert again.cached
    assert again.cost.is_zero
    assert again.table.equals(first.table)


def test_the_charge_precedes_the_selection(open_keys: Session,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> object:
        raise RuntimeError("selection failed")

    monkeypatch.setattr(answer_module, "select_keys", broken)
    before = charges(open_keys)
    with pytest.raises(dpsql.InternalError):
        open_keys.sql("SELECT zip, COUNT(*) FROM t GROUP BY zip")
    assert charges(open_keys) == before + 1
    assert open_keys.audit(last=1)[0]["outcome"] == "failed"


def test_pure_accounting_refuses_it_before_any_charge(tmp_path: Path) -> None:
    with dpsql.connect(_store(tmp_path, _policy("pure", "1")), "alice") as session:
        with pytest.raises(dpsql.QueryRejected, match="accounting is pure") as caught:
            session.sql("SELECT zip, COUNT(*) FROM t GROUP BY zip")
        assert charges(session) == 0
    assert "declare values" in (caught.value.advice or "")


def test_the_selections_deltas_add_up_to_at_most_the_policys() -> None:
    """Each query's delta is the policy's times its share of the dataset budget, so queries
    that spend the whole budget spend the policy's delta in all, however many they are."""
    total, delta = PrivacyCost.zcdp(Fraction(2)), 1e-6
    shares = [Fraction(1, 2), Fraction(1, 3), Fraction(1, 6), Fraction(1)]
    spent = [selection_delta(delta, PrivacyCost.zcdp(s), total) for s in shares]
    assert spent[0] == pytest.approx(2.5e-7)
    assert sum(spent) == pytest.approx(delta)
    assert selection_delta(delta, PrivacyCost.zcdp(Fraction(3)), total) == delta  # capped
    assert selection_delta(delta, PrivacyCost.zcdp(Fraction(1)), PrivacyCost.unbounded(
        "zcdp")) == delta  # no finite promise to keep
    assert selection_delta(None, PrivacyCost.zcdp(Fraction(1)), total) is None


def test_the_selection_delta_is_the_policys(open_keys: Session) -> None:
    plan = _plan(open_keys, "SELECT zip, COUNT(*) FROM t GROUP BY zip")
    noise = _gauss(Fraction(1, 2))
    found = Selection.of(plan, (noise,), open_keys.policy.delta)
    assert found == Selection(0, threshold(noise, 1, 1e-6), 1e-6)
    assert found.tau == 1 + math.ceil(math.sqrt(2 * math.log(1e6)))


@pytest.mark.parametrize("where", ["zip = 'lonely'", "hours < 0"], ids=["one_unit", "no_row"])
def test_no_key_released_is_an_empty_answer_fresh_and_cached(open_keys: Session,
                                                             where: str) -> None:
    """One unit's key passes tau (7 at sigma 1, delta 1e-6) with p < 2e-6; no row, never."""
    open_keys.sql("SET dpsql.ci = 0.9")
    sql = f"SELECT zip, COUNT(*), AVG(hours) FROM t WHERE {where} GROUP BY zip HAVING zip <> ''"
    for cached in (False, True):
        answer = open_keys.sql(sql)
        assert answer.cached is cached
        assert answer.table.num_rows == 0
        assert answer.kind == "dp"


# -- empirical privacy audit ---------------------------------------------------------------

AUDIT_DELTA = 1e-3  # the selection's delta; the rho-to-epsilon conversion gets as much


def _released_share(units: int, runs: int, tau: int) -> int:
    """In how many of ``runs`` answers a key held by ``units`` one-row units is released.

    A key no unit holds is not in the bounded source at all: never released.
    """
    if units == 0:
        return 0
    noise = _gauss(Fraction(1, 2))
    sparse = pa.table({"_k0": pa.array([f"k{i}" for i in range(runs)]),
                       "_m0": pa.array(np.full(runs, units), pa.int64())})
    released, _ = select_keys(_plan_stub(), sparse, (noise,), Selection(0, tau, AUDIT_DELTA))
    return released.keys[0].size


def _epsilon_lower_bound(units: int, runs: int, tau: int) -> float:
    """The 95% Clopper-Pearson lower bound on epsilon from the event "the key is released",
    on neighbours whose key has ``units`` and ``units + 1`` units, given delta
    (``P[S | more] <= e^eps P[S | fewer] + delta``); each side's bound holds at 97.5%."""
    more, fewer = _released_share(units + 1, runs, tau), _released_share(units, runs, tau)
    low = stats.beta.ppf(0.025, more, runs - more + 1) if more else 0.0
    high = stats.beta.ppf(0.975, fewer + 1, runs - fewer)
    return math.log(max(low - 2 * AUDIT_DELTA, 1e-300) / high)


@pytest.mark.parametrize("units", [0, 2], ids=["lonely", "near_tau"])
def test_the_audit_bound_does_not_exceed_the_claim(units: int) -> None:
    """20,000 runs a side: the bound exceeds the claim with probability < 5% if it holds.

    Claim: rho 1/2 at delta 1e-3 (epsilon 3.54) plus the selection's delta 1e-3. A key
    gaining its one unit (``lonely``) is the event the threshold guards: with tau halved
    the bound came out 7.4 there; a key near tau (2 units against 3) came out 2.2.
    """
    tau = threshold(_gauss(Fraction(1, 2)), 1, AUDIT_DELTA)
    claim = epsilon_from_rho(Fraction(1, 2), AUDIT_DELTA)
    assert _epsilon_lower_bound(units, 20_000, tau) <= claim
