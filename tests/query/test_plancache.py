"""A repeated query text reuses its plan, but only under the same policy and schema."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import dpsql
from dpsql.query import dp as answer_module
from dpsql.query.answer import Answer
from tests.conftest import ADULT_POLICY

from .conftest import INFINITE, apply_adult_bounds, charges, plain, with_budgets

SQL = "SELECT sex, SUM(capital_gain) AS s FROM adult GROUP BY sex"
NOT_NUMERIC = r"^column 'capital_gain' is not numeric"  # planned again: refused as new


@pytest.fixture
def plannings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts the planner validated (a reused plan is not validated again)."""
    seen: list[str] = []
    real = answer_module.plan_query

    def plan_query(ast, text, policy, types_of, catalog=None):  # type: ignore[no-untyped-def]
        seen.append(text)
        return real(ast, text, policy, types_of, catalog)

    monkeypatch.setattr(answer_module, "plan_query", plan_query)
    return seen


def test_a_repeated_text_is_planned_once(adult: dpsql.Session, plannings: list[str]) -> None:
    first = adult.sql(SQL)
    adult.sql("SET dpsql.epsilon = 0.2")
    second = adult.sql(SQL)
    assert plannings == [SQL]
    assert not second.cached  # a new cost is a new measurement, charged
    assert second.cost > first.cost
    assert second.columns["s"]["scale"] < first.columns["s"]["scale"]  # calibrated anew


def test_another_policy_plans_again(build: Callable[..., Path], plannings: list[str],
                                    tmp_path: Path) -> None:
    text = with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE)
    path = build(text)
    with dpsql.connect(path, "alice") as alice:
        alice.sql(SQL)
    apply_adult_bounds(path, tmp_path, "capital_gain", [0, 20])
    with dpsql.connect(path, "alice") as alice:
        answer = alice.sql(SQL)
        expected = plain(alice, "SELECT sex, SUM(least(capital_gain, 20)) FROM adult "
                                "GROUP BY sex ORDER BY sex")
    assert plannings == [SQL, SQL]
    assert _rows(answer) == expected


def test_changed_column_types_plan_again(build: Callable[..., Path],
                                         plannings: list[str]) -> None:
    path = build(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE))
    with dpsql.connect(path, "alice") as alice:
        alice.sql(SQL)
        with alice.store.transaction() as cur:
            cur.execute("CREATE OR REPLACE TABLE main.adult AS SELECT * REPLACE "
                        "(CAST(capital_gain AS DOUBLE) + 0.5 AS capital_gain) FROM main.adult")
    with dpsql.connect(path, "bob") as bob:
        answer = bob.sql(SQL)
        expected = plain(bob, "SELECT sex, SUM(least(capital_gain, 99)) FROM adult "
                              "GROUP BY sex ORDER BY sex")
    assert plannings == [SQL, SQL]
    assert _rows(answer) == expected  # halves: exact on the grid


def _retype(session: dpsql.Session, cast: str) -> None:
    """An administrator rebuilds the adult table with capital_gain as ``cast``."""
    with session.store.transaction() as cur:
        cur.execute("CREATE OR REPLACE TABLE main.adult AS SELECT * REPLACE "
                    f"({cast} AS capital_gain) FROM main.adult")


def test_a_kept_plan_whose_table_changed_is_planned_again_before_its_charge(
        build: Callable[..., Path], plannings: list[str]) -> None:
    # The kept plan's table types are read before its charge; they changed, so the
    # text is planned again and answered under one charge.
    path = build(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE))
    with dpsql.connect(path, "alice") as alice:
        alice.sql(SQL)
        _retype(alice, "CAST(capital_gain AS DOUBLE) + 0.5")
        alice.sql("SET dpsql.epsilon = 1e6")  # a new measurement: noise sd about 1e-4
        before = charges(alice)
        answer = alice.sql(SQL)
        assert charges(alice) == before + 1
        expected = plain(alice, "SELECT sex, SUM(least(capital_gain, 99)) FROM adult "
                                "GROUP BY sex ORDER BY sex")
        assert alice.audit(last=1)[0]["outcome"] == "answered"
    assert plannings == [SQL, SQL]
    assert not answer.cached
    got = _rows(answer)
    assert [k for k, _ in got] == [k for k, _ in expected]
    assert all(abs(g - e) < 0.5 for (_, g), (_, e) in zip(got, expected, strict=True))


def test_a_kept_plan_that_no_longer_plans_is_refused_before_its_charge(
        build: Callable[..., Path], plannings: list[str]) -> None:
    path = build(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE))
    with dpsql.connect(path, "alice") as alice:
        alice.sql(SQL)
        _retype(alice, "CAST(capital_gain AS VARCHAR)")
        alice.sql("SET dpsql.epsilon = 1")
        before = charges(alice)
        for _ in range(2):  # the stale plan is forgotten: the second send plans again too
            with pytest.raises(dpsql.QueryRejected, match=NOT_NUMERIC):
                alice.sql(SQL)
        assert charges(alice) == before
        assert [r["outcome"] for r in alice.audit(last=2)] == ["rejected", "rejected"]
    assert plannings == [SQL, SQL, SQL]


def test_a_kept_plan_whose_table_is_gone_costs_nothing(
        build: Callable[..., Path], plannings: list[str]) -> None:
    path = build(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE))
    with dpsql.connect(path, "alice") as alice:
        alice.sql(SQL)
        with alice.store.transaction() as cur:
            cur.execute("ALTER TABLE main.adult RENAME TO adult_old")
        before = charges(alice)
        for epsilon in (1, 2, 3):
            alice.sql(f"SET dpsql.epsilon = {epsilon}")
            with pytest.raises(dpsql.InternalError, match="cannot be read"):
                alice.sql(SQL)
        assert charges(alice) == before  # found before any charge
    assert plannings == [SQL, SQL, SQL, SQL]


@pytest.mark.parametrize("priced", [False, True])
def test_a_kept_plan_never_charged_is_checked_before_its_charge(
        build: Callable[..., Path], plannings: list[str], priced: bool) -> None:
    # No default cost: the first send is refused at pricing, so its SQL never bound.
    # Sent again unpriced, pricing the kept plan refuses it; priced, its first bind
    # comes before the charge. Either way the table changed: the refusal is the one
    # of the text planned again, and it costs nothing.
    path = build(with_budgets(ADULT_POLICY, budget=INFINITE))
    with dpsql.connect(path, "alice") as alice:
        with pytest.raises(dpsql.QueryRejected, match="no default query cost"):
            alice.sql(SQL)
        _retype(alice, "CAST(capital_gain AS VARCHAR)")
        if priced:
            alice.sql("SET dpsql.epsilon = 1")
        with pytest.raises(dpsql.QueryRejected, match=NOT_NUMERIC):
            alice.sql(SQL)
        assert charges(alice) == 0
    assert plannings == [SQL, SQL]


def test_a_kept_plan_is_checked_before_a_cached_answer_is_served(
        build: Callable[..., Path], plannings: list[str]) -> None:
    path = build(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE))
    with dpsql.connect(path, "alice") as alice:
        alice.sql(SQL)
        _retype(alice, "CAST(capital_gain AS VARCHAR)")
        before = charges(alice)
        with pytest.raises(dpsql.QueryRejected, match=NOT_NUMERIC):
            alice.sql(SQL)  # same cost: the cache would answer, but the plan is stale
        assert charges(alice) == before
    assert plannings == [SQL, SQL]


def test_rejections_are_never_kept(adult: dpsql.Session, plannings: list[str]) -> None:
    bad = "SELECT age, COUNT(*) FROM adult GROUP BY fnlwgt"
    for _ in range(2):
        with pytest.raises(dpsql.QueryRejected):
            adult.sql(bad)
    assert plannings == [bad, bad]
    assert [e["outcome"] for e in adult.audit(last=2)] == ["rejected", "rejected"]


def _rows(answer: Answer) -> list[tuple[object, ...]]:
    return sorted(tuple(row.values()) for row in answer.table.to_pylist())


def test_plans_are_per_user(build: Callable[..., Path], plannings: list[str]) -> None:
    # How fast a text is answered must not tell whether another user asked it.
    path = build(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE))
    with dpsql.connect(path, "alice") as alice, dpsql.connect(path, "bob") as bob:
        for session in (alice, bob, alice, bob):
            session.sql(SQL)
    assert plannings == [SQL, SQL]  # once for alice, once for bob
