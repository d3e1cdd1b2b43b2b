"""A repeated query text reuses its plan, but only under the same policy and schema."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import dpsql
from dpsql.query import answer as answer_module
from dpsql.query.answer import Answer
from tests.conftest import ADULT_POLICY

from .conftest import INFINITE, apply_adult_bounds, plain, with_budgets

SQL = "SELECT sex, SUM(capital_gain) AS s FROM adult GROUP BY sex"


@pytest.fixture
def plannings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts the planner validated (a reused plan is not validated again)."""
    seen: list[str] = []
    real = answer_module.plan_query

    def plan_query(ast, text, policy, types_of):  # type: ignore[no-untyped-def]
        seen.append(text)
        return real(ast, text, policy, types_of)

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
