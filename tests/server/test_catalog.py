"""The sanitized catalog: what it shows, what it never holds, and the clients it satisfies."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from dpsql.server.catalog import CatalogSource, relations
from dpsql.services import open_store

from .client_queries import DBEAVER, JDBC
from .conftest import PASSWORDS

VISIBLE = ["age", "sex", "race", "education_num", "income_50k"]


def test_relations_show_visible_columns_and_releases_only(server_store: Path):
    with open_store(server_store) as store:
        shown = {(r.schema, r.name): r for r in relations(store)}
    assert set(shown) == {("public", "adult"), ("released", "adult_syn")}
    assert [c for c, _ in shown["public", "adult"].columns] == VISIBLE
    assert shown["released", "adult_syn"].columns == (("age", "BIGINT"), ("sex", "BIGINT"),
                                                      ("race", "BIGINT"))
    assert "independent" in (shown["released", "adult_syn"].description or "")


def test_the_catalog_database_holds_no_private_value(server_store: Path):
    with open_store(server_store) as store:
        source = CatalogSource(store)

        def rows(sql: str) -> list[tuple[object, ...]]:
            table = source.sql(sql)  # in the sandbox, on the shared catalog
            return list(zip(*(column.to_pylist() for column in table.columns), strict=True))

        tables = rows("SELECT schema_name, table_name, estimated_size FROM duckdb_tables()")
        # Only catalog relations exist; none is named after or sized like the private table.
        assert {schema for schema, _, _ in tables} <= {"pgc", "pgis", "main"}
        assert not [t for t in tables if t[1] in ("adult", "adult_syn")]
        stats = rows("SELECT DISTINCT reltuples, relpages FROM pgc.pg_class")
        assert stats == [(-1.0, 0)]
        text = " ".join(str(v) for row in rows(
            "SELECT * FROM pgc.pg_attribute a JOIN pgc.pg_class c ON c.oid = a.attrelid "
            "WHERE c.relname = 'adult'") for v in row)
        assert "fnlwgt" not in text
        source.close()


def _run(conn: psycopg.Connection, sql: str, params: tuple[object, ...]) -> list[dict]:
    if params:
        sql = re.sub(r"\$\d+", "%s", sql.replace("%", "%%"))
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(sql, params or None)
        return cur.fetchall() if cur.description else []


@pytest.fixture(scope="module")
def conn(fake_server):
    with psycopg.connect(fake_server.dsn("alice"), autocommit=True) as connection:
        yield connection


@pytest.mark.parametrize(("name", "sql", "params"), JDBC, ids=[q[0] for q in JDBC])
def test_pgjdbc_metadata_queries(conn, name, sql, params):
    rows = _run(conn, sql, params)
    if name == "getTables":
        assert {(r["table_schem"], r["table_name"], r["table_type"]) for r in rows} == {
            ("public", "adult", "TABLE"), ("released", "adult_syn", "TABLE")}
    if name == "getColumns":
        assert [r["attname"] for r in rows] == VISIBLE
        assert [r["attnum"] for r in rows] == [1, 2, 3, 4, 5]
    if name == "getSchemas":
        assert {"public", "released", "pg_catalog"} <= {r["table_schem"] for r in rows}
    if name.startswith("TypeInfoCache"):
        assert len(rows) == 1
    if name == "TypeInfoCache.getSQLType":
        assert rows[0]["is_array"] is True
        assert rows[0]["typname"] == "_int4"


@pytest.mark.parametrize(("name", "sql", "params"), DBEAVER, ids=[q[0] for q in DBEAVER])
def test_dbeaver_navigator_queries(conn, name, sql, params):
    rows = _run(conn, sql, params)
    if name == "database":
        assert len(rows) == 1
        assert rows[0]["datname"] == "adult"
    if name == "default_objects":
        assert list(rows[0].values()) == ["adult", "public", "alice"]
    if name == "schemas":
        described = {r["nspname"]: r["description"] for r in rows}
        assert "differential privacy" in described["public"]
    if name == "tables":
        assert [(r["relname"], r["reltuples"], r["relpages"]) for r in rows] == [
            ("adult", -1.0, 0)]
        assert "differential privacy" in rows[0]["description"]
    if name == "tables_with_parents":
        assert [r["relname"] for r in rows] == ["adult_syn"]
    if name == "columns":
        assert [r["attname"] for r in rows] == VISIBLE
    if name == "type":
        assert rows[0]["typname"] == "text"
    if name == "search_path_setting":
        assert rows == [{"reset_val": "public, released"}]


def test_information_schema(conn):
    rows = _run(conn, "SELECT table_schema, table_name, column_name, data_type FROM "
                "information_schema.columns WHERE table_schema IN ('public', 'released') "
                "ORDER BY table_schema, ordinal_position", ())
    assert [r["column_name"] for r in rows if r["table_name"] == "adult"] == VISIBLE
    assert {r["data_type"] for r in rows} == {"bigint"}


def test_psql_describe_commands(fake_server):
    """The real psql's \\d family (its describe.c queries) against the catalog."""
    env = {"PGPASSWORD": PASSWORDS["alice"], "PATH": "/usr/bin:/bin"}
    dsn = f"host=127.0.0.1 port={fake_server.port} user=alice dbname=adult sslmode=disable"

    def psql(command: str) -> str:
        done = subprocess.run(["psql", dsn, "-X", "-c", command], capture_output=True,
                              text=True, env=env, timeout=60)
        assert "ERROR" not in done.stderr, (command, done.stderr)
        return done.stdout

    listing = psql(r"\d")
    assert re.search(r"public\s+\|\s+adult\s+\|\s+table", listing)
    assert re.search(r"released\s+\|\s+adult_syn\s+\|\s+table", listing)
    described = psql(r"\d adult")
    assert 'Table "public.adult"' in described
    assert "fnlwgt" not in described
    assert all(column in described for column in VISIBLE)
    sized = psql(r"\dt+")
    assert "differential privacy" in sized
    assert re.search(r"adult\s+\|\s+table\s+\|\s+dpsql\s+\|\s+permanent\s+\|\s+heap\s+\|\s+\|",
                     sized), "sizes of private tables must stay empty"
    for command in (r"\dn+", r"\l", r"\du", r"\df", r"\dT", r"\dx", r"\di", r"\dp", r"\db",
                    r"\d+ adult", r"\d released.adult_syn", r"\dS pg_class", r"\dconfig"):
        psql(command)


JAR = Path("/usr/share/java/postgresql.jar")


@pytest.mark.skipif(shutil.which("javac") is None or not JAR.exists(),
                    reason="needs a JDK and pgjdbc (Debian: libpostgresql-jdbc-java), which "
                           ".ci/run installs")
def test_pgjdbc_driver(fake_server, tmp_path):
    """The real JDBC driver DBeaver uses: metadata calls, prepared statements, errors."""
    source = Path(__file__).with_name("JdbcCheck.java")
    shutil.copy(source, tmp_path / source.name)
    subprocess.run(["javac", "-cp", str(JAR), source.name], cwd=tmp_path, check=True,
                   capture_output=True, timeout=300)
    done = subprocess.run(["java", "-cp", f"{JAR}:.", "JdbcCheck", str(fake_server.port),
                           "alice", PASSWORDS["alice"]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert seen["product"] == "PostgreSQL 15.0"
    assert seen["tables"] == "[adult, adult_syn]"
    assert seen["columns"] == "[" + ", ".join(VISIBLE) + "]"
    assert seen["released_columns"] == "[age, sex, race]"
    assert seen["schemas"] == "[information_schema, pg_catalog, public, released]"
    assert seen["dbeaver_tables"] == "[adult]"
    assert seen["catalogs"] == "[adult]"
    assert int(seen["type_info"]) > 40
    # pgjdbc binds parameters server-side, then (after 5 runs) prepares a named statement.
    assert seen["echo_first"] == "SELECT echo 0, 'it''s' FROM adult"
    assert seen["echo_last"] == "SELECT echo 6, 'it''s' FROM adult"
    assert seen["plain_sum"] == "7"
    assert seen["budget_state"] == "53400"
