"""Free queries run on a database that holds released tables only: isolation by construction.

The validation of :mod:`dpsql.query.released` is a second layer. These tests switch
it off and attack the isolated database directly, so they would fail if privacy
rested on the deny-list.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.errors import QueryRejected
from dpsql.query import answer
from dpsql.query.free import FREE
from dpsql.services import open_store
from dpsql.session import Session
from tests.query.conftest import charges

CANARY = "CANARY-5e1f0c77"


@pytest.fixture
def released(store_path: Path) -> Iterator[Session]:
    """Alice on a store with a canary in a sensitive table and one released table."""
    with open_store(store_path) as store, store.transaction() as cur:
        cur.execute(f"CREATE TABLE main.canary AS SELECT '{CANARY}' AS secret, 4242.125 AS x")
        cur.execute("CREATE TABLE released.codes AS SELECT * FROM (VALUES (0, 'female'), "
                    "(1, 'male')) t(sex, label)")
    with dpsql.connect(store_path, "alice") as session:
        yield session


def free_rows(session: Session, sql: str) -> list[tuple[object, ...]]:
    """``sql`` run as written on the free database, in its sandbox (no validation at all)."""
    store = session.store
    with store[FREE].using(store) as copy:
        table = copy.run(sql, user="alice")
    return list(zip(*(column.to_pylist() for column in table.columns), strict=True))


def test_the_isolated_database_holds_released_tables_and_macros_only(released: Session) -> None:
    tables = free_rows(released, "SELECT schema_name, table_name FROM duckdb_tables()")
    assert tables == [("released", "codes")]
    assert free_rows(released, "SELECT count(*) FROM duckdb_views() WHERE NOT internal") \
        == [(0,)]
    schemas = {r[0] for r in free_rows(released, "SELECT schema_name FROM duckdb_schemas() "
                                                 "WHERE NOT internal")}
    assert schemas <= {"main", "released", "public_tables", "udfs"}
    assert "dpsql" not in schemas
    databases = free_rows(released, "SELECT path FROM duckdb_databases() WHERE NOT internal")
    assert len(databases) == 1
    assert Path(str(databases[0][0])).resolve() != released.store.path
    assert free_rows(released, "SELECT count(*) FROM duckdb_sequences()") == [(0,)]


@pytest.mark.parametrize("sql", [
    "SELECT * FROM released.codes, main.canary",
    "SELECT * FROM released.codes, canary",
    "SELECT * FROM released.codes, main.adult",
    "SELECT * FROM released.codes, dpsql.meta",
    "SELECT * FROM released.codes, dpsql.credentials",
    "SELECT * FROM released.codes CROSS JOIN LATERAL histogram_values(canary, secret)",
    "SELECT * FROM released.codes CROSS JOIN LATERAL histogram(adult, age)",
    "SELECT * FROM released.codes, query_table('canary')",
    "SELECT * FROM released.codes, query('SELECT * FROM adult')",
    "SELECT nextval('dpsql.event_ids')",
    "SELECT json_serialize_plan('SELECT min(x), max(x), count(*) FROM main.canary')",
    "SELECT * FROM released.codes, duckdb_tables()",
    "SELECT * FROM released.codes, duckdb_columns()",
    "SELECT * FROM released.codes, duckdb_constraints()",
    "SELECT * FROM released.codes, duckdb_databases()",
    "SELECT * FROM released.codes, duckdb_settings()",
    "SELECT * FROM released.codes, information_schema.columns",
])
def test_attacks_find_nothing_even_without_validation(
        released: Session, monkeypatch: pytest.MonkeyPatch, sql: str) -> None:
    """With the deny-list and table checks switched off, private data is still unreachable."""
    monkeypatch.setattr(answer, "check_released", lambda *args: [])
    try:
        reply = str(released.sql(sql).table.to_pylist())
    except QueryRejected as err:
        reply = str(err)
        assert "query on released tables failed" in reply
    for private in (CANARY, "4242.125", released.store.secret, str(released.store.path)):
        assert private not in reply
    assert charges(released) == 0


@pytest.mark.parametrize("sql", [
    "ATTACH '{path}' AS s (READ_ONLY)",
    "SELECT * FROM read_parquet('{path}')",
    "SELECT * FROM read_blob('{path}')",
    "COPY released.codes TO '{path}.csv'",
    "CREATE TABLE released.more AS SELECT 1",
    "SET enable_external_access = true",
])
def test_the_isolated_database_reaches_no_file_and_cannot_change(
        released: Session, sql: str) -> None:
    with pytest.raises(duckdb.Error):
        free_rows(released, sql.format(path=released.store.path))


def test_free_queries_still_work_on_released_data(released: Session) -> None:
    answer_ = released.sql("SELECT label, udfs.dp_bin(sex, 2) AS b FROM released.codes "
                           "ORDER BY label")
    assert answer_.table.to_pylist() == [{"label": "female", "b": 0}, {"label": "male", "b": 0}]
    assert released.sql("SELECT 1 + 1 AS two").table.to_pylist() == [{"two": 2}]
    assert charges(released) == 0


def test_closing_the_store_removes_the_copy(store_path: Path) -> None:
    session = dpsql.connect(store_path, "alice")
    session.sql("SELECT 1 AS one")
    folder = session.store[FREE]._folder
    assert any(folder.iterdir())
    session.close()
    assert not folder.exists()


def test_the_isolated_database_has_a_memory_and_spill_limit(released: Session) -> None:
    settings = dict(free_rows(released, "SELECT name, value FROM duckdb_settings() WHERE name "
                                        "IN ('memory_limit', 'max_temp_directory_size', "
                                        "'python_enable_replacements')"))
    assert settings["python_enable_replacements"] == "false"
    assert settings["max_temp_directory_size"] == "3.7 GiB"
    default = duckdb.connect().execute("SELECT current_setting('memory_limit')").fetchall()
    assert gib(settings["memory_limit"]) < gib(default[0][0]) / 2  # 25% of memory, not 80%


def gib(text: str) -> float:
    number, unit = text.split()
    return float(number) * {"GiB": 1.0, "MiB": 1 / 1024, "TiB": 1024.0}[unit]
