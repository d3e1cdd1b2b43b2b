"""The statement router: SET/RESET/SHOW, budgets, options, positions in error messages."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import dpsql
from dpsql.privacy import WHY_RHO, PrivacyCost, rho_from_epsilon_delta
from dpsql.query.statement import (
    ExplainStatement,
    QueryStatement,
    ResetStatement,
    SetStatement,
    ShowStatement,
    classify,
)
from dpsql.session import Session
from tests.conftest import ADULT_POLICY
from tests.query.conftest import charges, with_budgets


@pytest.mark.parametrize(("text", "expected"), [
    ("SET dpsql.epsilon = 0.5", SetStatement("dpsql.epsilon", "0.5")),
    ("set dpsql.ci to 0.9;", SetStatement("dpsql.ci", "0.9")),
    ("SET SESSION dpsql.ci = 'off'", SetStatement("dpsql.ci", "off")),
    ("RESET dpsql.epsilon", ResetStatement("dpsql.epsilon")),
    ("RESET ALL", ResetStatement("ALL")),
    ("SHOW dpsql.budget", ShowStatement("dpsql.budget")),
    ("  -- a comment\n SHOW ALL ;", ShowStatement("ALL")),
])
def test_classify(text: str, expected: object) -> None:
    assert classify(text) == expected


def test_classify_queries_and_explain() -> None:
    assert isinstance(classify("SELECT COUNT(*) FROM adult;"), QueryStatement)
    explain = classify("EXPLAIN PRIVACY\nSELECT COUNT(*) FROM adult")
    assert isinstance(explain, ExplainStatement)
    assert explain.text.strip() == "SELECT COUNT(*) FROM adult"
    assert explain.text[:explain.offset].strip() == ""  # positions are preserved


def test_set_show_reset(adult: Session) -> None:
    assert adult.sql("SET dpsql.epsilon = 0.25").status == "SET"
    shown = adult.sql("SHOW dpsql.epsilon").table.to_pylist()
    assert shown == [{"name": "dpsql.epsilon", "value": "0.25", "source": "session"}]
    adult.sql("SET dpsql.rho = 0.001")  # replaces epsilon
    assert "epsilon" not in adult.options
    assert adult.options["rho"] == "0.001"
    assert adult.sql("SELECT COUNT(*) FROM adult").cost == PrivacyCost.zcdp("0.001")
    assert adult.sql("RESET ALL").status == "RESET"
    assert adult.options == {}
    names = adult.sql("SHOW ALL").table.column("name").to_pylist()
    assert names == ["dpsql.epsilon", "dpsql.delta", "dpsql.rho", "dpsql.ci",
                     "dpsql.nonnegative_counts", "dpsql.target_error"]


def test_budget_statements_agree(adult: Session) -> None:
    adult.sql("SELECT COUNT(*) FROM adult")
    shown = adult.sql("SHOW dpsql.budget")
    selected = adult.sql("SELECT * FROM dpsql_budget()")
    assert shown.kind == selected.kind == "budget"
    assert shown.table.equals(selected.table)
    row = shown.table.to_pylist()[0]
    standing = adult.budget()[0]
    assert row["dataset"] == "adult"
    assert row["unit"] == "rho"
    # four significant figures, never less spent nor more left than is true
    assert row["spent"] == 0.0003211 >= float(standing.spent) > 0.000321
    assert row["remaining"] == 0.08783 <= float(standing.remaining) < 0.08784
    assert row["remaining_epsilon"] == 1.996 <= standing.remaining.epsilon(1e-6) < 1.997
    assert row["granted_epsilon"] == 2
    assert row["delta"] == 1e-6
    assert shown.notice == selected.notice == f"dpsql: {WHY_RHO}"
    with pytest.raises(dpsql.QueryRejected, match="SELECT \\* FROM dpsql_budget"):
        adult.sql("SELECT dataset FROM dpsql_budget() WHERE spent > 0")


def test_googlesql_options_take_precedence(adult: Session) -> None:
    adult.sql("SET dpsql.epsilon = 0.2")
    answer = adult.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, delta = 1e-7) "
                       "COUNT(*) FROM adult")
    assert answer.cost == rho_from_epsilon_delta("0.5", "1e-7")
    assert adult.sql("SELECT COUNT(*) FROM adult").cost == adult.cost(epsilon="0.2")


def test_pure_policy_refuses_delta_and_rho(pure_adult: Session) -> None:
    with pytest.raises(dpsql.ConfigurationError, match="no delta"):
        pure_adult.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, delta = 1e-7) "
                       "COUNT(*) FROM adult")
    pure_adult.sql("SET dpsql.rho = 0.01")
    with pytest.raises(dpsql.ConfigurationError, match="rho needs accounting: zcdp"):
        pure_adult.sql("SELECT COUNT(*) FROM adult")


def test_a_policy_without_a_default_needs_an_epsilon(build: Callable[..., Path]) -> None:
    text = with_budgets(ADULT_POLICY, budget={"epsilon": 5})  # no query_cap, no default
    with dpsql.connect(build(text), "alice") as alice:
        with pytest.raises(dpsql.QueryRejected, match=r"SET dpsql\.epsilon"):
            alice.sql("SELECT COUNT(*) FROM adult")
        alice.sql("SET dpsql.epsilon = 0.3")
        assert alice.sql("SELECT COUNT(*) FROM adult").cost == alice.cost(epsilon="0.3")


def test_confidence_intervals(exact_adult: Session) -> None:
    exact_adult.sql("SET dpsql.ci = 0.9")
    answer = exact_adult.sql("SELECT sex, COUNT(*) AS n, SUM(age) AS s, AVG(age) AS a, "
                             "COUNT(*) + 1 AS plus FROM adult GROUP BY sex")
    assert answer.table.column_names == ["sex", "n", "n_ci_low", "n_ci_high", "s", "s_ci_low",
                                         "s_ci_high", "a", "a_ci_low", "a_ci_high", "plus"]
    for row in answer.table.to_pylist():  # no noise: the intervals are points
        assert row["n_ci_low"] == row["n"] == row["n_ci_high"]
        assert row["a_ci_low"] == pytest.approx(row["a"]) == row["a_ci_high"]
    exact_adult.sql("SET dpsql.ci = off")
    assert "n_ci_low" not in exact_adult.sql("SELECT COUNT(*) AS n FROM adult").table.column_names
    with pytest.raises(dpsql.ConfigurationError, match="confidence"):
        exact_adult.sql("SET dpsql.ci = 95")


def test_error_positions_and_advice(adult: Session) -> None:
    with pytest.raises(dpsql.QueryRejected) as caught:
        adult.sql("SELECT COUNT(*)\nFROM adult\nWHERE fnlwgt > 3")
    assert (caught.value.line, caught.value.column) == (3, 7)
    assert caught.value.construct == "hidden column"
    with pytest.raises(dpsql.QueryRejected) as caught:
        adult.sql("EXPLAIN PRIVACY\n  SELECT MODE(age) FROM adult")
    assert (caught.value.line, caught.value.column) == (2, 10)
    with pytest.raises(dpsql.QueryRejected, match="did you mean 'hours_per_week'"):
        adult.sql("SELECT SUM(hours_per_wek) FROM adult")


def test_show_datasets_lists_public_schema_only(adult: Session) -> None:
    table = adult.sql("SHOW dpsql.datasets").table
    columns = table.column("column").to_pylist()
    assert "fnlwgt" not in columns
    assert "age" in columns
    rows = {r["column"]: r for r in table.to_pylist()}
    assert rows["age"]["group_by"] == "dp_bin(age)"
    assert rows["education_num"]["group_by"] == "education_num"
    assert rows["sex"]["domain"] == "{0, 1}"


def test_show_of_something_else_is_rejected(adult: Session) -> None:
    with pytest.raises(dpsql.QueryRejected, match="SHOW search_path is not available"):
        adult.sql("SHOW search_path")


@pytest.mark.parametrize("text", ["SELECT COUNT(*) FROM adult WHERE sex IN ('', '\x00x')",
                                  "SELECT COUNT(*) FROM adult -- \x00",
                                  "EXPLAIN PRIVACY SELECT COUNT(*) FROM adult WHERE sex = '\x00'"])
def test_nul_is_refused_before_any_charge(adult: Session, text: str) -> None:
    # DuckDB cannot parse NUL in a literal: unrefused, such a query failed after its charge.
    before = charges(adult)
    with pytest.raises(dpsql.QueryRejected, match="NUL character") as caught:
        adult.sql(text)
    assert (caught.value.line, caught.value.column) == (1, text.index("\x00") + 1)
    assert charges(adult) == before
