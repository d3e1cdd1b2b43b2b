"""Bounds the database enforces (CHECK constraints set at import) replace the per-row clamp.

A column whose values all fit its declared bounds at import gets them as a
CHECK; the generated SQL then reads it unclamped. Whenever the table lacks the
CHECK (replaced, or a value outside the bounds at import) or the policy's
bounds are narrower than the CHECK, the clamp is back, so answers never depend
on the shortcut.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest
import yaml

import dpsql
from dpsql.query.engine import DuckDBEngine, between_bounds
from tests.conftest import ADULT_POLICY

from .conftest import INFINITE, plain, with_budgets

POLICY = f"""version: 1
accounting: pure
datasets:
  t:
    table: t
    budget: {INFINITE}
    query_cap: {INFINITE}
    default_query: {INFINITE}
    columns:
      fits: {{type: integer, bounds: [0, 10], bins: 2}}
      wide: {{type: integer, bounds: [0, 10], bins: 2}}
      real: {{type: float, bounds: [-1.5, 2.5], bins: 2}}
users:
  admin: {{role: admin, budgets: {{t: {INFINITE}}}}}
"""

SUM = "SELECT SUM(capital_gain) FROM adult WHERE age BETWEEN 20 AND 40"


@pytest.fixture
def small(tmp_path: Path) -> Path:
    csv = tmp_path / "t.csv"
    csv.write_text("fits,wide,real\n0,3,-1.5\n10,11,2.5\n,4,0.25\n")
    policy = tmp_path / "t.yaml"
    policy.write_text(POLICY)
    store, _ = dpsql.init(tmp_path / "t.duckdb", policy, {"t": csv})
    store.close()
    return tmp_path / "t.duckdb"


def test_import_enforces_the_bounds_of_columns_that_fit(small: Path) -> None:
    with dpsql.connect(small, "admin") as session:
        held = DuckDBEngine(session.store).enforced_bounds("t")
        assert held == {"fits": (0, 10), "real": (Fraction(-3, 2), Fraction(5, 2))}
        cur = session.store.cursor()
        for row in ("11, 0, 0", "0, 0, 2.6", "0, 0, 'nan'", "0, 0, 'inf'"):
            with pytest.raises(duckdb.ConstraintException):
                cur.execute(f"INSERT INTO main.t VALUES ({row})")
        cur.execute("INSERT INTO main.t VALUES (NULL, 99, NULL)")  # NULL and unchecked pass


def test_only_unenforced_columns_are_clamped(small: Path, engine_calls: list[str]) -> None:
    with dpsql.connect(small, "admin") as session:
        answer = session.sql("SELECT SUM(fits) AS f, SUM(wide) AS w, SUM(real) AS r FROM t")
        generated = engine_calls[-1]
        assert "CASE" not in generated.split("AS _m0")[0]
        assert "CASE" in generated.split("AS _m0")[1].split("AS _m1")[0]
        assert "CASE" not in generated.split("AS _m1")[1]
        assert answer.table.to_pylist() == [{"f": 10, "w": 17, "r": 1.25}]  # 11 clamped to 10


def test_sum_over_enforced_bounds_is_exact(exact_adult: dpsql.Session,
                                           engine_calls: list[str]) -> None:
    answer = exact_adult.sql(SUM)
    assert "CASE" not in engine_calls[-1]
    assert answer.table.column(0).to_pylist() == [plain(exact_adult, SUM)[0][0]]


def test_a_table_without_the_check_is_clamped_again(build: Callable[..., Path],
                                                    engine_calls: list[str]) -> None:
    path = build(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE))
    with dpsql.connect(path, "alice") as alice:
        alice.sql(SUM)
        assert "CASE" not in engine_calls[-1]
        with alice.store.transaction() as cur:  # an administrator rebuilds the table
            cur.execute("CREATE OR REPLACE TABLE main.adult AS SELECT * FROM main.adult")
            cur.execute("UPDATE main.adult SET capital_gain = 1000000 WHERE age = 30")
    with dpsql.connect(path, "bob") as bob:  # same text, same plan; no cached answer for bob
        answer = bob.sql(SUM)
        assert "CASE" in engine_calls[-1]
        clamped = SUM.replace("SUM(capital_gain)", "SUM(least(capital_gain, 99))")
        assert answer.table.column(0).to_pylist() == [plain(bob, clamped)[0][0]]


def test_narrower_policy_bounds_bring_the_clamp_back(build: Callable[..., Path],
                                                     engine_calls: list[str]) -> None:
    path = build(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE))
    narrow = path.with_suffix(".narrow.yaml")
    raw = yaml.safe_load(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE))
    raw["datasets"]["adult"]["columns"]["capital_gain"]["bounds"] = [0, 50]
    narrow.write_text(yaml.safe_dump(raw))
    with dpsql.connect(path, "admin") as admin:
        admin.apply_policy(narrow)
    with dpsql.connect(path, "alice") as alice:
        answer = alice.sql(SUM)
        assert "CASE" in engine_calls[-1]
        clamped = SUM.replace("SUM(capital_gain)", "SUM(least(capital_gain, 50))")
        assert answer.table.column(0).to_pylist() == [plain(alice, clamped)[0][0]]


@pytest.mark.parametrize(("expression", "expected"), [
    ("(a BETWEEN 0 AND 99)", ("a", 0, 99)),
    ('("a b" BETWEEN -5 AND 2.5)', ("a b", -5, Fraction(5, 2))),
    ("(a BETWEEN (-1) AND 1e3)", ("a", -1, 1000)),
    ("(a BETWEEN CAST(0.5 AS INTEGER) AND 3)", None),  # a cast may round: not read
    ("((a >= 0) AND (a <= 1))", None),
    ("(a BETWEEN b AND 3)", None),
    ("((a BETWEEN 1 AND 2) OR (a IS NULL))", None),
    ("(t.a BETWEEN 1 AND 2)", None),
    ("(a BETWEEN 'x' AND 'y')", None),
])
def test_only_plain_between_checks_count(expression: str, expected: object) -> None:
    assert between_bounds(expression) == expected
