"""End to end: `dpsql serve` with the real session.sql, driven by psql, psycopg and pandas."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import psycopg
import pytest

from dpsql.ledger import Ledger
from dpsql.policies import active_policy
from dpsql.privacy import PrivacyCost
from dpsql.services import open_store

from .client_queries import DBEAVER, JDBC
from .conftest import (
    PASSWORDS,
    ServerProcess,
    make_store,
    serve_args,
    start_server,
)

CLIENTS = 50


@pytest.fixture(scope="module")
def served(server_store: Path) -> Iterator[ServerProcess]:
    with start_server(serve_args(server_store)) as server:
        yield server


def _psql(server: ServerProcess, user: str, script: str) -> subprocess.CompletedProcess[str]:
    env = {"PGPASSWORD": PASSWORDS[user], "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    dsn = f"host=127.0.0.1 port={server.port} user={user} dbname=adult"
    return subprocess.run(["psql", dsn, "-X", "-v", "ON_ERROR_STOP=0", "-v", "VERBOSITY=verbose"],
                          input=script, capture_output=True, text=True, env=env, timeout=120)


def test_psql_session(served):
    done = _psql(served, "alice", "SELECT count(*) AS people FROM adult;\n"
                 "\\d\n"
                 "\\d adult\n"
                 "SELECT age, sex FROM released.adult_syn ORDER BY age, sex LIMIT 3;\n")
    assert re.search(r"people\s*\n-+\s*\n\s*-?\d", done.stdout), done.stdout + done.stderr
    assert "NOTICE" in done.stderr
    assert "epsilon" in done.stderr
    assert re.search(r"released\s+\|\s+adult_syn\s+\|\s+table", done.stdout)
    assert "fnlwgt" not in done.stdout
    assert re.search(r"age \| sex\s*\n-+\+-+\s*\n(\s+\d+ \|\s+\d+\s*\n){3}\(3 rows\)",
                     done.stdout), done.stdout
    assert "ERROR" not in done.stderr, done.stderr


def test_psql_reads_the_budget_error(served):
    done = _psql(served, "dave", "SET dpsql.epsilon = 1;\n"
                 "SELECT count(*) FROM adult WHERE sex = 1;\n"
                 "SELECT count(*) FROM adult WHERE sex = 0;\n"
                 "SHOW dpsql.budget;\n")
    assert "ERROR:  53400" in done.stderr, done.stderr
    assert "budget" in done.stderr.lower()
    assert done.stdout.count("(1 row)") >= 1


def test_psql_gets_a_rejection_for_a_too_deep_query(served):
    deep = "SELECT count(*) FROM adult WHERE " + "(" * 80 + "sex = 1" + ")" * 80 + ";\n"
    done = _psql(served, "alice", deep + "SELECT 1 AS still_here;\n")
    assert "ERROR:  42000: this query is nested too deeply" in done.stderr, done.stderr
    assert "internal error" not in done.stderr
    assert "still_here" in done.stdout


def test_show_all_lists_client_parameters_and_dpsql_options(served):
    with psycopg.connect(served.dsn("alice"), autocommit=True) as conn:
        conn.execute("SET dpsql.epsilon = 0.3")
        rows = {name: (setting, note) for name, setting, note in conn.execute("SHOW ALL")}
    assert rows["application_name"][0] == ""
    assert rows["dpsql.epsilon"] == ("0.3", "session")
    assert "dpsql.ci" in rows


def test_psycopg_simple_and_extended_protocol(served):
    with psycopg.connect(served.dsn("alice"), autocommit=True) as conn:
        notices = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
        conn.execute("SET dpsql.epsilon = 0.2")
        simple = conn.pgconn.exec_(b"SELECT count(*) FROM adult WHERE sex = 1")
        assert simple.status == psycopg.pq.ExecStatus.TUPLES_OK
        assert int(simple.get_value(0, 0)) > 0
        rows = conn.execute("SELECT sex, count(*) AS n FROM adult WHERE age >= %s "
                            "GROUP BY sex ORDER BY sex", [30]).fetchall()
        assert [r[0] for r in rows] == [0, 1]
        assert len(notices) == 2
        assert all("epsilon" in n for n in notices)
        budget = conn.execute("SELECT * FROM dpsql_budget()").fetchall()
        assert budget


@pytest.mark.parametrize(("statement", "sqlstate"), [
    pytest.param("SELECT * FROM adult", "42000", id="raw_rows"),
    pytest.param("SELECT * FROM main.adult", "42000", id="raw_table"),
    pytest.param("SELECT * FROM read_csv('/etc/passwd')", "42000", id="file_function"),
    pytest.param("CREATE TABLE stolen AS SELECT 1", "42000", id="ddl_create"),
    pytest.param("DROP TABLE adult", "42000", id="ddl_drop"),
    pytest.param("SET dpsql.epsilon = -1", "22023", id="bad_epsilon"),
    pytest.param("SELECT fnlwgt, count(*) FROM adult GROUP BY fnlwgt", "42000",
                 id="hidden_column"),
])
def test_refusals_carry_their_sqlstate(served, statement, sqlstate):
    with psycopg.connect(served.dsn("alice"), autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(statement)
        assert caught.value.sqlstate == sqlstate
        message = caught.value.diag.message_primary or ""
        assert len(message) > 20
        assert "Traceback" not in message
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_budget_exhaustion_sqlstate(served):
    with psycopg.connect(served.dsn("erin"), autocommit=True) as conn:
        conn.execute("SET dpsql.epsilon = 1")
        conn.execute("SELECT count(*) FROM adult WHERE race = 1")
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as caught:
            conn.execute("SELECT count(*) FROM adult WHERE race = 2")
        assert caught.value.sqlstate == "53400"


def test_pandas_read_sql(served):
    with psycopg.connect(served.dsn("alice"), autocommit=True) as conn, \
            warnings.catch_warnings():
        # pandas warns that it only tests SQLAlchemy connectables; psycopg works.
        warnings.filterwarnings("ignore", message=".*SQLAlchemy.*", category=UserWarning)
        frame = pd.read_sql("SELECT race, count(*) AS n FROM adult GROUP BY race "
                            "ORDER BY race", conn)
        released = pd.read_sql("SELECT * FROM released.adult_syn", conn)
    assert list(frame["race"]) == [0, 1, 2, 3, 4]
    assert len(released) == 200
    assert list(released.columns) == ["age", "sex", "race"]


def test_catalog_sequences_against_the_real_server(served):
    with psycopg.connect(served.dsn("alice"), autocommit=True) as conn:
        for name, sql, params in JDBC + DBEAVER:
            if params:
                sql = re.sub(r"\$\d+", "%s", sql.replace("%", "%%"))
            conn.execute(sql, params or None)
            assert name


def test_concurrent_clients_spend_exactly_the_budget(tmp_path: Path):
    """50 clients ask a 0.1 query each at once; carol has 1.0: exactly 10 are answered."""
    store_path = make_store(tmp_path / "concurrent.duckdb")
    answered, refused, other = [], [], []
    barrier = threading.Barrier(CLIENTS)
    with start_server(serve_args(store_path, "--workers", "8")) as server:
        def client(i: int) -> None:
            with psycopg.connect(server.dsn("carol"), autocommit=True) as conn:
                conn.execute("SET dpsql.epsilon = 0.1")
                barrier.wait(timeout=60)
                try:
                    # A different WHERE per client: no answer can come from the cache.
                    conn.execute("SELECT count(*) FROM adult WHERE age >= %s", [i])
                    answered.append(i)
                except psycopg.errors.ConfigurationLimitExceeded:
                    refused.append(i)
                except psycopg.Error as err:
                    other.append(repr(err))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert other == []
    assert len(answered) == 10
    assert len(refused) == CLIENTS - 10
    with open_store(store_path) as store:
        standing = Ledger(store, active_policy(store)).budget("carol", "adult")
    assert standing.spent == PrivacyCost.pure("1.0")


def test_psql_free_path_reaches_nothing_private(served):
    """The read-through attacks of the first review, as an analyst's psql session sends them."""
    attacks = [
        "SELECT * FROM released.adult_syn CROSS JOIN LATERAL histogram(adult, fnlwgt);",
        "SELECT * FROM released.adult_syn CROSS JOIN LATERAL histogram_values(adult, age);",
        "SELECT json_serialize_plan('SELECT min(fnlwgt), max(fnlwgt), count(*) FROM adult');",
        "SELECT * FROM released.adult_syn, dpsql.credentials;",
        "SELECT * FROM released.adult_syn, query_table('dpsql.meta');",
        "SELECT * FROM released.adult_syn, duckdb_tables();",
    ]
    done = _psql(served, "alice", "\n".join(attacks) + "\nSELECT count(*) AS n FROM "
                 "released.adult_syn;\n")
    assert done.stderr.count("ERROR:  42") == len(attacks), done.stderr
    assert "internal error" not in done.stderr
    assert re.search(r"\bn\s*\n-+\s*\n\s*200\s*\n", done.stdout), done.stdout
    everything = done.stdout + done.stderr
    assert "SCRAM-SHA-256" not in everything
    assert not re.search(r"[0-9a-f]{64}", everything)  # the store secret's form


def test_psql_error_oracle_is_refused_before_any_charge(served):
    """Literal arithmetic that overflows is refused at plan time, whatever the rows hold."""
    show = "SHOW dpsql.budget;\n"
    done = _psql(served, "erin", show + "SELECT count(*) FROM adult WHERE age > 30 AND "
                 "sex < 9223372036854775807 + 1;\n"
                 "SELECT count(*) FROM adult WHERE age > 200 AND "
                 "sex < 9223372036854775807 + 1;\n" + show)
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 2, done.stderr
    where = re.compile(r"\(line \d+, column \d+\)")
    assert where.sub("", errors[0]) == where.sub("", errors[1])  # whether rows match or not
    assert errors[0].startswith("ERROR:  42000")
    before, after = done.stdout.split("(1 row)")[:2]
    assert "spent" in before
    assert before.strip() == after.strip()  # nothing was charged
