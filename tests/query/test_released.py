"""Free read-only SQL over released.* tables, and what it may not reach."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import dpsql
from dpsql.services import open_store
from dpsql.session import Session
from tests.query.conftest import charges


@pytest.fixture
def released(store_path: Path) -> Iterator[Session]:
    """Alice on a store with two tables in schema released (made directly, as issue 4 would)."""
    with open_store(store_path) as store, store.transaction() as cur:
        cur.execute("CREATE TABLE released.adult_syn AS SELECT age, sex, race, income_50k "
                    "FROM main.adult LIMIT 200")
        cur.execute("CREATE TABLE released.codes AS SELECT * FROM (VALUES (0, 'female'), "
                    "(1, 'male')) t(sex, label)")
    with dpsql.connect(store_path, "alice") as session:
        yield session


def test_any_read_only_sql_is_free(released: Session) -> None:
    answer = released.sql(
        "WITH s AS (SELECT * FROM released.adult_syn) "
        "SELECT c.label, count(*) AS n, avg(age) AS mean_age, "
        "rank() OVER (ORDER BY count(*) DESC) AS r "
        "FROM s JOIN released.codes c USING (sex) "
        "WHERE age > (SELECT min(age) FROM released.adult_syn) "
        "GROUP BY c.label ORDER BY n DESC")
    assert answer.kind == "released"
    assert answer.cost.is_zero
    assert answer.table.column_names == ["label", "n", "mean_age", "r"]
    assert answer.status == f"SELECT {answer.table.num_rows}"
    assert charges(released) == 0
    assert released.audit(last=1)[0]["action"] == "released"


def test_raw_rows_of_a_released_table_and_udfs(released: Session) -> None:
    answer = released.sql("SELECT udfs.dp_bin(age, 10) AS decade, * FROM released.adult_syn "
                          "LIMIT 5")
    assert answer.table.num_rows == 5
    assert all(v % 10 == 0 for v in answer.table.column("decade").to_pylist())


def test_show_released(released: Session) -> None:
    tables = released.sql("SHOW dpsql.released").table.column("table").to_pylist()
    assert tables == ["released.adult_syn", "released.codes"]


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT * FROM released.adult_syn JOIN adult USING (age)", "not a released table"),
    ("SELECT * FROM released.adult_syn, main.adult", "not a released table"),
    ("SELECT * FROM released.adult_syn WHERE age IN (SELECT age FROM adult)",
     "not a released table"),
    ("SELECT * FROM released.adult_syn WHERE age IN (SELECT key FROM dpsql.meta)",
     "not a released table"),
    # A CTE named like a sensitive table only shadows it where it is in scope.
    ("SELECT * FROM (WITH adult AS (SELECT * FROM released.adult_syn) SELECT * FROM adult) s, "
     "adult", "not a released table"),
    ("WITH adult AS (SELECT * FROM adult) SELECT * FROM released.adult_syn",
     "not a released table"),
    ("WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r) "
     "SELECT * FROM released.adult_syn, r", "recursive"),
    ("SELECT * FROM released.adult_syn, read_csv('/etc/passwd')", "read_csv"),
    ("SELECT * FROM released.adult_syn, query('SELECT * FROM adult')", "query"),
    ("SELECT getenv('HOME') FROM released.adult_syn", "getenv"),
    ("SELECT current_setting('threads') FROM released.adult_syn", "current_setting"),
    # The ledger's event counter: reading or advancing it would expose other users' activity.
    ("SELECT nextval('dpsql.event_ids') FROM released.adult_syn LIMIT 1", "nextval"),
    ("SELECT currval('dpsql.event_ids')", "currval"),
    ("SELECT * FROM released.missing", "no released table 'missing'"),
    ("SELECT * FROM released.adult_sin", "did you mean 'adult_syn'"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) count(*) FROM released.codes",
     "already DP"),
    ("SELECT nope FROM released.codes", "failed"),
])
def test_released_queries_reach_nothing_else(released: Session, engine_calls: list[str],
                                             sql: str, message: str) -> None:
    with pytest.raises(dpsql.QueryRejected, match=message):
        released.sql(sql)
    if message != "failed":
        assert engine_calls == []
    assert charges(released) == 0
    assert released.audit(last=1)[0]["outcome"] == "rejected"


def test_a_query_without_from_is_answered_free(released: Session) -> None:
    answer = released.sql("SELECT 1 + 1 AS two")
    assert answer.kind == "released"
    assert answer.table.to_pylist() == [{"two": 2}]
