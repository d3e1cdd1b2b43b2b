"""Bounds the database enforces (CHECK constraints set at import) replace the per-row clamp.

With ``enforce_bounds`` the policy's numeric bounds become CHECK constraints of
the imported table (a value outside refuses the import), and the generated SQL
reads those columns unclamped. Whether a column is enforced is the
administrator's choice, never a fact about the rows (it shows in query times).
Whenever the table lacks the CHECK (imported without it, or rebuilt) or the
policy's bounds are narrower than the CHECK, the clamp is back.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.engines.base import between_bounds
from dpsql.engines.local import DuckDBEngine
from tests.conftest import ADULT_POLICY

from .conftest import INFINITE, apply_adult_bounds, plain, table_policy, with_budgets

POLICY = table_policy("""      whole: {type: integer, bounds: [0, 10], bins: 2}
      real: {type: float, bounds: [-1.5, 2.5], bins: 2}""")

SUM = "SELECT SUM(capital_gain) FROM adult WHERE age BETWEEN 20 AND 40"
CLAMPED = "SELECT SUM(least(capital_gain, {hi})) FROM adult WHERE age BETWEEN 20 AND 40"


def _small(tmp_path: Path, rows: str, enforce: bool) -> Path:
    csv = tmp_path / "t.csv"
    csv.write_text("whole,real\n" + rows)
    policy = tmp_path / "t.yaml"
    policy.write_text(POLICY)
    path = tmp_path / "t.duckdb"
    store, _ = dpsql.init(path, policy, {"t": csv}, enforce_bounds=enforce)
    store.close()
    return path


def _enforced(session: dpsql.Session, table: str) -> dict[str, tuple[Fraction, Fraction]]:
    engine = DuckDBEngine(session.store)
    try:
        return engine.enforced_bounds(table)
    finally:
        engine.close()


def test_enforced_bounds_are_checks_the_database_keeps(tmp_path: Path) -> None:
    path = _small(tmp_path, "0,-1.5\n10,2.5\n,0.25\n", enforce=True)
    with dpsql.connect(path, "admin") as session:
        assert _enforced(session, "t") == {"whole": (0, 10),
                                            "real": (Fraction(-3, 2), Fraction(5, 2))}
        cur = session.store.cursor()
        for row in ("11, 0", "0, 2.6", "0, 'nan'", "0, '-inf'"):
            with pytest.raises(duckdb.ConstraintException):
                cur.execute(f"INSERT INTO main.t VALUES ({row})")
        cur.execute("INSERT INTO main.t VALUES (NULL, NULL)")  # NULL passes


def test_a_value_outside_the_bounds_refuses_the_import(tmp_path: Path) -> None:
    with pytest.raises(dpsql.ConfigurationError, match="whole hold values outside"):
        _small(tmp_path, "0,0\n11,0\n", enforce=True)
    assert not (tmp_path / "t.duckdb").exists()


def test_without_enforcement_nothing_depends_on_the_rows(tmp_path: Path,
                                                         engine_calls: list[str]) -> None:
    path = _small(tmp_path, "0,-1.5\n10,2.5\n", enforce=False)  # the values fit, yet
    with dpsql.connect(path, "admin") as session:
        assert _enforced(session, "t") == {}
        answer = session.sql("SELECT SUM(whole) AS w, SUM(real) AS r FROM t")
        assert engine_calls[-1].count("CASE") == 2  # both clamped
        assert answer.table.to_pylist() == [{"w": 10, "r": 1.0}]


def test_enforced_columns_are_summed_unclamped(tmp_path: Path,
                                               engine_calls: list[str]) -> None:
    path = _small(tmp_path, "0,-1.5\n10,2.5\n", enforce=True)
    with dpsql.connect(path, "admin") as session:
        answer = session.sql("SELECT SUM(whole) AS w, SUM(real) AS r FROM t")
        assert "CASE" not in engine_calls[-1]
        assert answer.table.to_pylist() == [{"w": 10, "r": 1.0}]


@pytest.fixture
def enforced_adult(build: Callable[..., Path]) -> Path:
    return build(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE),
                 enforce_bounds=True)


def test_sum_over_enforced_bounds_is_exact(enforced_adult: Path,
                                           engine_calls: list[str]) -> None:
    with dpsql.connect(enforced_adult, "alice") as alice:
        answer = alice.sql(SUM)
        assert "CASE" not in engine_calls[-1]
        assert answer.table.column(0).to_pylist() == [plain(alice, SUM)[0][0]]


def test_a_table_without_the_check_is_clamped_again(enforced_adult: Path,
                                                    engine_calls: list[str]) -> None:
    with dpsql.connect(enforced_adult, "alice") as alice:
        alice.sql(SUM)
        assert "CASE" not in engine_calls[-1]
        with alice.store.transaction() as cur:  # an administrator rebuilds the table
            cur.execute("CREATE OR REPLACE TABLE main.adult AS SELECT * FROM main.adult")
            cur.execute("UPDATE main.adult SET capital_gain = 1000000 WHERE age = 30")
        alice.sql("SET dpsql.epsilon = 1e6")  # a new measurement (noise sd < 0.01), same plan
        answer = alice.sql(SUM)
        assert "CASE" in engine_calls[-1]
        assert answer.table.column(0).to_pylist() == [plain(alice, CLAMPED.format(hi=99))[0][0]]


@pytest.mark.parametrize("kept_plan", [False, True])
def test_the_schema_read_and_the_sum_share_one_snapshot(
        enforced_adult: Path, monkeypatch: pytest.MonkeyPatch, kept_plan: bool) -> None:
    # The table is rebuilt right after the statement reads its column types: on the
    # main thread while planning, on a helper while the charge commits (a kept plan).
    real = DuckDBEngine.column_types

    def read_then_rebuild(self: DuckDBEngine, table: str) -> dict[str, str]:
        types = real(self, table)
        with self.store.transaction() as cur:
            cur.execute("CREATE OR REPLACE TABLE main.adult AS SELECT * REPLACE "
                        "(capital_gain * 0 + 1000000 AS capital_gain) FROM main.adult")
        return types

    with dpsql.connect(enforced_adult, "alice") as alice:
        before = plain(alice, SUM)[0][0]
        if kept_plan:
            alice.sql(SUM)
            alice.sql("SET dpsql.epsilon = 1e6")  # a new measurement (noise sd < 0.01)
        monkeypatch.setattr(DuckDBEngine, "column_types", read_then_rebuild)
        answer = alice.sql(SUM)
        monkeypatch.undo()
        assert plain(alice, "SELECT min(capital_gain) FROM adult") == [(1000000,)]  # rebuilt
    assert answer.table.column(0).to_pylist() == [before]  # the table the SQL was made for


def test_narrower_policy_bounds_bring_the_clamp_back(enforced_adult: Path, tmp_path: Path,
                                                     engine_calls: list[str]) -> None:
    apply_adult_bounds(enforced_adult, tmp_path, "capital_gain", [0, 50])
    with dpsql.connect(enforced_adult, "alice") as alice:
        answer = alice.sql(SUM)
        assert "CASE" in engine_calls[-1]
        assert answer.table.column(0).to_pylist() == [plain(alice, CLAMPED.format(hi=50))[0][0]]


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
