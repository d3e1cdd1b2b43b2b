"""The rewrite passes, each on its own, on real DuckDB data with awkward values."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import sqlglot

import dpsql
from dpsql.imports import table_columns
from dpsql.query.dialect import DIALECT
from dpsql.query.evaluate import arrow_pattern
from dpsql.query.model import canonical_sql
from dpsql.query.planner import plan_query
from dpsql.query.render import (
    PASSES,
    Context,
    bound_contributions,
    encode_keys,
    expand_public_keys,
    filter_rows,
    to_sql,
)
from dpsql.session import Session

POLICY = """
version: 1
accounting: pure
datasets:
  t:
    table: t
    privacy_unit: person
    max_rows: 2
    budget: {epsilon: .inf}
    default_query: {epsilon: .inf}
    columns:
      person: {type: hidden}
      x: {type: float, bounds: [-1, 1], nullable: true}
      k: {type: categorical, values: [a, b]}
      n: {type: integer, bounds: [0, 3], bins: 1}
users:
  admin: {role: admin, budgets: {t: {epsilon: .inf}}}
  alice: {role: analyst, budgets: {t: {epsilon: .inf}}}
"""
ROWS = [  # person, x, k, n
    (1, 0.5, "a", 0), (1, 0.25, "a", 1), (1, 0.75, "b", 2),  # person 1 has 3 rows: 2 kept
    (2, float("nan"), "a", 3), (2, float("inf"), "b", 9),      # NaN -> lower bound, inf -> upper
    (3, float("-inf"), "c", -4), (3, None, None, None),        # 'c' and NULL k are no public key
    (4, 100.0, "b", 1),                                         # clamped to 1
]


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    csv = tmp_path / "t.csv"
    con = duckdb.connect()
    con.execute("CREATE TABLE t (person INT, x DOUBLE, k VARCHAR, n INT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", ROWS)
    con.execute(f"COPY t TO '{csv}' (HEADER)")
    con.close()
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY)
    store, _ = dpsql.init(tmp_path / "s.duckdb", policy, {"t": csv},
                          outside="keep")  # the rows outside the domain are the point
    store.close()
    with dpsql.connect(tmp_path / "s.duckdb", "alice") as alice:
        yield alice


def _plan(session: Session, sql: str) -> tuple[object, Context]:
    types = table_columns(session.store, "t")
    plan = plan_query(DIALECT.parse(sql)[0], sql, session.policy, lambda _: types)
    return plan, Context(session.store.secret, types, exact=True)


def _run(session: Session, select: object) -> pa.Table:
    return session.store.cursor().sql(select.sql(dialect="duckdb")).to_arrow_table()  # type: ignore[attr-defined]


def test_passes_are_listed_in_order() -> None:
    assert [p.__name__ for p in PASSES] == ["bound_contributions", "filter_rows",
                                            "encode_keys", "clamp_and_sum"]


def test_bound_contributions_keeps_at_most_max_rows_per_unit(session: Session) -> None:
    plan, ctx = _plan(session, "SELECT COUNT(*) FROM t")
    from sqlglot import exp

    rows = _run(session, bound_contributions(exp.select("person"), plan, ctx))  # type: ignore[arg-type]
    counts = np.bincount(rows.column("person").to_numpy())
    assert counts.max() == 2
    assert counts.sum() == 7
    again = _run(session, bound_contributions(exp.select("person", "n"), plan, ctx))  # type: ignore[arg-type]
    assert sorted(again.to_pylist(), key=str) == sorted(
        _run(session, bound_contributions(exp.select("person", "n"), plan, ctx)).to_pylist(),  # type: ignore[arg-type]
        key=str)  # the choice is fixed by the store secret, not redrawn


def test_filter_rows_is_the_validated_predicate(session: Session) -> None:
    plan, ctx = _plan(session, "SELECT COUNT(*) FROM t WHERE n BETWEEN 1 AND 2")
    from sqlglot import exp

    select = filter_rows(bound_contributions(exp.select("n"), plan, ctx), plan, ctx)  # type: ignore[arg-type]
    assert set(_run(session, select).column("n").to_pylist()) <= {1, 2}


def test_clamping_maps_nan_and_infinities_into_bounds(session: Session) -> None:
    answer = session.sql("SELECT SUM(x), COUNT(x), AVG(x) FROM t")
    kept = session.store.cursor().sql(
        "SELECT x FROM " + "(" + _sql_of_bounded(session) + ")").fetchall()
    values = [v for (v,) in kept if v is not None]
    clamped = [(-1.0 if np.isnan(v) else min(max(v, -1.0), 1.0)) for v in values]
    row = answer.table.to_pylist()[0]
    assert row["sum_x"] == pytest.approx(sum(clamped), abs=1e-6)
    assert row["count_x"] == len(values)
    assert row["avg_x"] == pytest.approx(sum(clamped) / len(values), abs=1e-6)


def _sql_of_bounded(session: Session) -> str:
    from dpsql.engines.source import bounded_sql

    return "SELECT * FROM " + bounded_sql(session.policy.dataset("t"), session.store.secret)


def test_keys_outside_the_public_domain_fall_in_no_cell(session: Session) -> None:
    answer = session.sql("SELECT k, n, COUNT(*) FROM t GROUP BY k, n")
    table = answer.table.to_pylist()
    assert len(table) == 2 * 4  # k in {a, b} x n in 0..3: the full public key set
    expected = session.store.cursor().sql(
        f"SELECT k, least(greatest(n, 0), 3) AS n, count(*) FROM ({_sql_of_bounded(session)}) "
        "WHERE k IN ('a', 'b') AND n IS NOT NULL GROUP BY ALL").fetchall()
    got = {(r["k"], r["n"]): r["count"] for r in table}
    for k, n, count in expected:
        assert got.pop((k, n)) == count
    assert set(got.values()) == {0}


def test_expand_public_keys_fills_empty_cells(session: Session) -> None:
    plan, _ = _plan(session, "SELECT k, COUNT(*) FROM t GROUP BY k")
    sparse = pa.table({"_k0": pa.array(["b", None, "zzz"]), "_m0": pa.array([5, 7, 9])})
    dense = expand_public_keys(plan, sparse)  # type: ignore[arg-type]
    assert dense[0].tolist() == [0, 5]  # 'a' empty, NULL and 'zzz' dropped


def test_generated_sql_never_contains_the_analyst_text(session: Session) -> None:
    plan, ctx = _plan(session, "SELECT k, COUNT(*) FROM t   WHERE   n=1 GROUP BY k")
    sql = to_sql(plan, ctx).sql(dialect="duckdb")  # type: ignore[arg-type]
    assert "n=1" not in sql
    assert '"n" = 1' in sql
    assert "row_number() OVER (PARTITION BY \"person\"" in sql.replace("ROW_NUMBER", "row_number")


@pytest.mark.parametrize(("pattern", "escape", "arrow"), [
    ("a%", None, "a%"), ("a\\b", None, "a\\\\b"), ("50!%", "!", "50\\%"), ("a!!b", "!", "a\\!b"),
])
def test_like_patterns_translate_to_arrow(pattern: str, escape: str | None, arrow: str) -> None:
    assert arrow_pattern(pattern, escape) == arrow


def test_encode_keys_gives_codes_for_numeric_keys(session: Session) -> None:
    plan, ctx = _plan(session, "SELECT dp_bin(x, 0.5), COUNT(*) FROM t GROUP BY 1")
    from sqlglot import exp

    select = encode_keys(bound_contributions(exp.select(), plan, ctx), plan, ctx)  # type: ignore[arg-type]
    codes = set(_run(session, select).column("_k0").to_pylist())
    # bins of 0.5 over [-1, 1]: lower edges -1, -0.5, 0, 0.5, 1 -> codes 0..4; NULL -> 5
    assert codes <= {0, 1, 2, 3, 4, 5}


@pytest.mark.parametrize(("one", "other", "same"), [
    ("(race = 2)", "race = 2", True),
    ("((((sex = 1))))", "sex = 1", True),
    ("((a OR b)) AND c", "(a OR b) AND c", True),
    ("((a + 1)) * 2 > 3", "(a + 1) * 2 > 3", True),
    ("NOT (a BETWEEN 1 AND 2)", "NOT a BETWEEN 1 AND 2", True),
    ("(a OR b) AND c", "a OR b AND c", False),
    ("a OR (b AND c)", "(a OR b) AND c", False),
    ("NOT (a = 1 OR b = 2)", "NOT a = 1 OR b = 2", False),
    ("(a + 1) * 2 > 3", "a + 1 * 2 > 3", False),
    ("a - (b - c) > 0", "a - b - c > 0", False),
])
def test_canonical_conditions_drop_only_redundant_parentheses(one: str, other: str,
                                                               same: bool) -> None:
    # The cache keys a measurement by this text: equal texts must mean equal conditions.
    texts = [canonical_sql(sqlglot.parse_one(t, read="duckdb")) for t in (one, other)]
    assert (texts[0] == texts[1]) is same, texts
