"""pandas through SQLAlchemy, psycopg's named cursors and COPY, psql's \\copy and \\d+.

All against a real ``dpsql serve``: reflection runs on the sanitized catalog,
DP answers are charged once however they are read (whole, in pieces through a
cursor, or copied out), and released tables read like any table.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pandas as pd
import psycopg
import pytest
import sqlalchemy as sa

from .conftest import PASSWORDS, ServerProcess, serve_args, start_server

VISIBLE = ["age", "sex", "race", "education_num", "income_50k"]


@pytest.fixture(scope="module")
def served(server_store: Path) -> Iterator[ServerProcess]:
    with start_server(serve_args(server_store)) as server:
        yield server


def _engine(server: ServerProcess, user: str) -> sa.Engine:
    url = sa.URL.create("postgresql+psycopg", username=user, password=PASSWORDS[user],
                        host="127.0.0.1", port=server.port, database="adult",
                        query={"sslmode": "disable"})
    return sa.create_engine(url, poolclass=sa.NullPool)


def _spent(server: ServerProcess, user: str) -> Decimal:
    with psycopg.connect(server.dsn(user), autocommit=True) as conn:
        row = conn.execute("SHOW dpsql.budget").fetchone()
    assert row is not None
    return Decimal(str(row[3]))


def _psql(server: ServerProcess, user: str, script: str) -> subprocess.CompletedProcess[str]:
    env = {"PGPASSWORD": PASSWORDS[user], "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    dsn = f"host=127.0.0.1 port={server.port} user={user} dbname=adult sslmode=disable"
    return subprocess.run(["psql", dsn, "-X"], input=script, capture_output=True, text=True,
                          env=env, timeout=120)


def test_sqlalchemy_reflects_datasets_and_releases(served):
    inspector = sa.inspect(_engine(served, "alice"))
    assert {"public", "released"} <= set(inspector.get_schema_names())
    assert inspector.get_table_names(schema="public") == ["adult"]
    assert inspector.get_table_names(schema="released") == ["adult_syn"]
    columns = inspector.get_columns("adult", schema="public")
    assert [c["name"] for c in columns] == VISIBLE  # the hidden fnlwgt never shows
    assert [c["comment"] for c in columns][:3] == ["age in whole years", "1: male, 0: female",
                                                   None]
    released = inspector.get_columns("adult_syn", schema="released")
    assert [(c["name"], c["comment"]) for c in released] == [
        ("age", "age in whole years"), ("sex", "1: male, 0: female"), ("race", None)]
    assert inspector.has_table("adult", schema="public")
    assert inspector.has_table("adult_syn", schema="released")
    assert not inspector.has_table("fnlwgt", schema="public")
    assert inspector.get_table_comment("adult", schema="public")["text"].startswith(
        "Adult census sample")
    assert "synthetic release of dataset adult" in \
        inspector.get_table_comment("adult_syn", schema="released")["text"]


def test_pandas_reads_a_dp_query_once_and_a_released_table(served):
    engine = _engine(served, "carol")
    answer = pd.read_sql(sa.text("SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex "
                                 "ORDER BY sex"), engine)
    assert list(answer.columns) == ["sex", "n"]
    assert answer["sex"].tolist() == [0, 1]
    assert _spent(served, "carol") == Decimal("0.1")
    released = pd.read_sql("SELECT * FROM released.adult_syn", engine)
    assert released.shape == (200, 3)
    with engine.connect() as conn:
        chunks = list(pd.read_sql(sa.text("SELECT * FROM released.adult_syn ORDER BY age, sex, "
                                          "race"), conn.execution_options(stream_results=True),
                                  chunksize=64))
    assert [len(c) for c in chunks] == [64, 64, 64, 8]
    pd.testing.assert_frame_equal(pd.concat(chunks, ignore_index=True),
                                  released.sort_values(["age", "sex", "race"],
                                                       ignore_index=True))
    assert _spent(served, "carol") == Decimal("0.1")


def test_a_named_cursor_computes_a_dp_answer_once(served):
    with psycopg.connect(served.dsn("frank")) as conn, conn.cursor("pieces") as cursor:
        cursor.execute("SELECT race, COUNT(*) AS n FROM adult GROUP BY race ORDER BY race")
        assert [d.name for d in cursor.description] == ["race", "n"]
        first = cursor.fetchmany(2)
        rest = cursor.fetchall()
        assert [row[0] for row in first + rest] == [0, 1, 2, 3, 4]
        assert conn.execute("SELECT name FROM pg_catalog.pg_cursors").fetchall() == [("pieces",)]
    assert _spent(served, "frank") == Decimal("0.1")


def test_psycopg_copy_matches_a_query(served):
    query = "SELECT age, sex, race FROM released.adult_syn ORDER BY age, sex, race"
    with psycopg.connect(served.dsn("alice"), autocommit=True) as conn:
        expected = [tuple(str(v) for v in row) for row in conn.execute(query).fetchall()]
        with conn.cursor().copy(f"COPY ({query}) TO STDOUT") as copy:
            copied = list(copy.rows())
    assert copied == expected


def test_psql_copies_dp_and_released_answers_to_files(served, tmp_path):
    dp, released = tmp_path / "dp.csv", tmp_path / "released.txt"
    done = _psql(served, "erin",
                 f"\\copy (SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex ORDER BY sex) TO "
                 f"'{dp}' WITH CSV HEADER\n"
                 f"\\copy released.adult_syn (age, race) TO '{released}'\n"
                 "COPY released.adult_syn TO '/tmp/dpsql-leak.csv';\n")
    assert done.stdout.splitlines()[:2] == ["COPY 2", "COPY 200"], done.stderr
    assert "ERROR:  COPY reads no files and writes none" in done.stderr
    lines = dp.read_text().splitlines()
    assert lines[0] == "sex,n"
    assert [line.split(",")[0] for line in lines[1:]] == ["0", "1"]
    rows = [line.split("\t") for line in released.read_text().splitlines()]
    assert len(rows) == 200
    assert all(len(row) == 2 for row in rows)
    assert _spent(served, "erin") == Decimal("0.1")
    assert not Path("/tmp/dpsql-leak.csv").exists()


def test_psql_shows_column_descriptions(served):
    done = _psql(served, "alice", "\\d+ adult\n"
                 "SELECT col_description('adult'::regclass, 2) AS sex_means;\n")
    assert "age in whole years" in done.stdout, done.stderr
    assert "1: male, 0: female" in done.stdout
    assert "fnlwgt" not in done.stdout
    assert "sampling weight" not in done.stdout  # a hidden column's description stays hidden
    assert "ERROR" not in done.stderr, done.stderr
