"""Joins of a dataset to a public table: exact answers, noise scale, and the policy's checks.

The public table ``edu`` (tests/data/education_levels.csv) is keyed by Adult's
``education_num`` and leaves out code 15, so an inner join drops rows a left
join keeps under a NULL key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

import dpsql
from dpsql.engines.source import bounded_sql
from dpsql.policy import Policy
from dpsql.query.dialect import DIALECT
from dpsql.query.planner import plan_query
from dpsql.services import open_store
from dpsql.session import Session
from tests.conftest import ADULT_POLICY, ADULT_SAMPLE
from tests.query.conftest import (
    INFINITE,
    _init,
    plain,
    with_budgets,
    with_public_table,
)
from tests.query.test_exact import check_grouped
from tests.query.test_noise_scale import check_scale

JOIN = "adult a JOIN edu e ON a.education_num = e.education_num"
LEFT = "adult a LEFT JOIN edu e ON a.education_num = e.education_num"

# (name, query for both dpsql and plain DuckDB, number of leading key columns)
CASES = [
    ("inner_by_public", f"SELECT e.level, COUNT(*), SUM(a.age), AVG(hours_per_week) FROM {JOIN} "
     "GROUP BY e.level", 1),
    ("left_keeps_unmatched_as_null", f"SELECT e.level, COUNT(*), SUM(capital_gain) FROM {LEFT} "
     "GROUP BY e.level", 1),
    ("unqualified_and_reversed", "SELECT level, COUNT(*) FROM adult JOIN edu "
     "ON edu.education_num = adult.education_num GROUP BY level", 1),
    ("public_where", f"SELECT COUNT(*), AVG(age) FROM {JOIN} WHERE e.years > 10 "
     "AND e.level <> 'high'", 0),
    ("public_and_private_keys", f"SELECT e.level, sex, COUNT(*), VAR_POP(age) FROM {JOIN} "
     "GROUP BY 1, 2", 2),
    ("numeric_public_key", f"SELECT e.years, COUNT(*) FROM {LEFT} WHERE sex = 1 GROUP BY 1", 1),
    ("public_filter", f"SELECT COUNT(*) FILTER (WHERE e.level = 'high'), COUNT(*) FROM {LEFT}",
     0),
]


@pytest.fixture(scope="module")
def joined_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    text = with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE)
    return _init(tmp_path_factory.mktemp("join"), "join", with_public_table(text))


@pytest.fixture
def joined(joined_path: Path) -> Iterator[Session]:
    with dpsql.connect(joined_path, "alice") as session:
        yield session


@pytest.mark.parametrize(("sql", "keys"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_join_matches_plain_duckdb(joined: Session, sql: str, keys: int) -> None:
    check_grouped(joined, sql, sql, keys)


def test_group_by_public_column_lists_every_public_value(joined: Session) -> None:
    """The keys come from the public table: a level no row has still gets its row (zero)."""
    sql = f"SELECT e.level, COUNT(*) AS n FROM {JOIN} WHERE e.level = 'low' GROUP BY 1"
    rows = {r["level"]: r["n"] for r in joined.sql(sql).table.to_pylist()}
    assert rows == {"high": 0, "low": plain(joined, sql)[0][1], "mid": 0}
    left = f"SELECT e.level, COUNT(*) AS n FROM {LEFT} GROUP BY 1"
    assert [r["level"] for r in joined.sql(left).table.to_pylist()] == \
        ["high", "low", "mid", None]


def test_inner_and_left_joins_are_different_measurements(joined: Session) -> None:
    inner = joined.sql(f"SELECT COUNT(*) FROM {JOIN}").table.column(0)[0].as_py()
    left = joined.sql(f"SELECT COUNT(*) FROM {LEFT}").table.column(0)[0].as_py()
    assert inner < left == plain(joined, "SELECT COUNT(*) FROM adult")[0][0]


def test_join_noise_keeps_the_dataset_sensitivity(build: Callable[..., Path]) -> None:
    """Each private row meets one public row, so COUNT(*) has sensitivity max_rows (2 here).

    3,168 public cells (16 education keys incl. NULL x 2 sexes x 99 hours); the
    check (tests/query/test_noise_scale.py) rejects a scale 0.7x or 1.3x the
    right one, so a sensitivity of 1 or 3 fails it. The exact counts come from
    plain DuckDB over the rows the bounding keeps.
    """
    raw = yaml.safe_load(with_budgets(ADULT_POLICY, accounting="pure", budget={"epsilon": 10},
                                      cap={"epsilon": 1}, default={"epsilon": 0.5},
                                      max_rows=2, unit="age"))
    sql = ("SELECT e.education_num AS k, sex, dp_bin(hours_per_week, 1) AS h, COUNT(*) AS v "
           "FROM {source} LEFT JOIN {edu} e ON a.education_num = e.education_num "
           "GROUP BY ALL")
    with dpsql.connect(build(with_public_table(yaml.safe_dump(raw))), "alice") as session:
        answer = session.sql(sql.format(source="adult a", edu="edu"))
        kept = bounded_sql(session.policy.dataset("adult"), session.store.secret)
        reference = sql.format(source=kept.replace("AS _src", "AS a"),
                               edu="public_tables.edu").replace(
            "dp_bin(hours_per_week, 1)", "hours_per_week")
        exact = {(k, s, h): v for k, s, h, v in session.store.cursor().sql(reference).fetchall()}
    rows = answer.table.to_pylist()
    assert len(rows) == 16 * 2 * 99
    assert sum(exact.values()) < 500  # the bounding kept 2 rows per age: the reference did too
    draws = np.array([r["v"] - exact.get((r["k"], r["sex"], r["h"]), 0) for r in rows],
                     dtype=float)
    check_scale(draws, "discrete_laplace", 2 / 0.5)


def _policy(tmp_path: Path, table: dict[str, object], csv: str) -> Path:
    (tmp_path / "lookup.csv").write_text(csv)
    raw = yaml.safe_load(ADULT_POLICY.read_text())
    raw["public_tables"] = {"lookup": table}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(("csv", "key", "error"), [
    ("k,v\n1,a\n2,b\n1,c\n", "k", "is not unique (1 appears 2 times)"),
    ("k,v\n1.5,a\n2.5,b\n", "k", "must be an integer or text column"),
    ("k,v\n1,a\n", "missing", "has no column 'missing'"),
], ids=["duplicate_key", "float_key", "unknown_key"])
def test_policy_refuses_a_public_table_without_a_unique_key(
        tmp_path: Path, csv: str, key: str, error: str) -> None:
    policy = _policy(tmp_path, {"path": "lookup.csv", "key": key}, csv)
    with pytest.raises(dpsql.PolicyError, match=error.replace("(", r"\(").replace(")", r"\)")):
        dpsql.init(tmp_path / "s.duckdb", policy, {"adult": ADULT_SAMPLE})


def test_policy_refuses_a_missing_store_table(tmp_path: Path) -> None:
    policy = _policy(tmp_path, {"table": "nowhere", "key": "k"}, "")
    with pytest.raises(dpsql.PolicyError, match="the store has no table 'nowhere'"):
        dpsql.init(tmp_path / "s.duckdb", policy, {"adult": ADULT_SAMPLE})


def test_policy_refuses_a_dataset_table_as_public(tmp_path: Path) -> None:
    policy = _policy(tmp_path, {"table": "adult", "key": "age"}, "")
    with pytest.raises(dpsql.PolicyError, match="holds dataset 'adult', which is sensitive"):
        Policy.load(policy)


def test_public_tables_are_free_to_read(joined: Session) -> None:
    """Public, so on the free path: no charge, the rows as they are."""
    answer = joined.sql("SELECT level, count(*) AS n FROM public_tables.edu GROUP BY 1 "
                        "ORDER BY 1")
    assert answer.kind == "released"
    assert answer.cost.units == 0
    assert answer.table.to_pylist() == [{"level": "high", "n": 2}, {"level": "low", "n": 9},
                                        {"level": "mid", "n": 4}]


def test_a_key_duplicated_after_the_policy_check_matches_no_row(build: Callable[..., Path]
                                                                 ) -> None:
    """Second layer: should the store's copy gain a duplicate key, rows never fan out."""
    text = with_public_table(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE))
    path = build(text)
    with open_store(path) as store, store.transaction() as cur:
        cur.execute("INSERT INTO public_tables.edu VALUES (0, 'low', 5)")
    with dpsql.connect(path, "alice") as session:
        left = session.sql(f"SELECT COUNT(*) FROM {LEFT}").table.column(0)[0].as_py()
        inner = session.sql(f"SELECT COUNT(*) FROM {JOIN}").table.column(0)[0].as_py()
        total, zeros, fifteens = plain(session, "SELECT COUNT(*), COUNT(*) FILTER "
                                       "(WHERE education_num = 0), COUNT(*) FILTER "
                                       "(WHERE education_num = 15) FROM adult")[0]
    assert left == total
    assert inner == total - zeros - fifteens


class _Catalog:
    """The public table ``edu`` as the planner would read it (no store needed)."""

    def types(self, table: str) -> dict[str, str]:
        return {"education_num": "BIGINT", "level": "VARCHAR"}

    def values(self, table: str, column: str) -> tuple[object, ...]:
        return ("high", "low", "mid")


def test_a_dataset_on_another_engine_refuses_joins_before_the_charge() -> None:
    raw = yaml.safe_load(with_public_table(ADULT_POLICY.read_text()))
    raw["datasets"]["adult"]["engine"] = {"kind": "postgres", "table": "public.adult",
                                          "dsn_env": "DPSQL_TEST_DSN"}
    policy = Policy.from_text(yaml.safe_dump(raw))
    sql = f"SELECT e.level, COUNT(*) FROM {JOIN} GROUP BY 1"
    types = {c: "BIGINT" for c in policy.dataset("adult").columns}
    with pytest.raises(dpsql.QueryRejected, match="joins run on datasets in the store; adult "
                       "is on PostgreSQL"):
        plan_query(DIALECT.parse(sql)[0], sql, policy, lambda _: types, _Catalog())
    raw["datasets"]["adult"].pop("engine")
    local = Policy.from_text(yaml.safe_dump(raw))
    plan = plan_query(DIALECT.parse(sql)[0], sql, local, lambda _: types, _Catalog())
    assert plan.join is not None
    assert plan.keys[0].values == ("high", "low", "mid")
