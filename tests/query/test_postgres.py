"""PostgresEngine against a real PostgreSQL server (a throwaway cluster per test session).

The same policies and data on DuckDB and on PostgreSQL give identical exact
answers (unbounded budgets: no noise); contribution bounding keeps the same
rows on both; credentials appear in no answer, error, audit row or policy
output; an engine that is down charges nothing; cancel reaches the server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlglot
import yaml

import dpsql
from dpsql import provenance
from dpsql.engines.base import EngineError
from dpsql.engines.interrupt import Interrupter
from dpsql.engines.local import DuckDBEngine
from dpsql.engines.postgres import PostgresEngine, range_check
from dpsql.engines.source import bounded_sql
from dpsql.errors import (
    DPSQLError,
    InternalError,
    PolicyError,
    QueryCanceled,
    QueryRejected,
    ReleaseError,
)
from dpsql.policy import Policy
from dpsql.release import ReleaseRequest
from tests import pgcluster
from tests.conftest import ADULT_POLICY, ADULT_SAMPLE
from tests.query.conftest import ACS_DATA, ACS_POLICY, INFINITE, charges, with_budgets
from tests.query.engine_corpus import (
    BOUNDED_ROWS,
    CORPUS,
    check_identical,
    exported_rows,
    record_streams,
)
from tests.waits import until

pytestmark = pytest.mark.skipif(pgcluster.initdb_path() is None,
                                reason="PostgreSQL is not installed (apt-get install postgresql)")
PASSWORD_ENV = "DPSQL_TEST_PG_PASSWORD"
SECRETS = (pgcluster.READER_PASSWORD, pgcluster.SUPER_PASSWORD)

@pytest.fixture(scope="session")
def pg() -> Iterator[pgcluster.Cluster]:
    os.environ[PASSWORD_ENV] = pgcluster.READER_PASSWORD
    with pgcluster.cluster() as cluster:
        yield cluster


def engine_spec(cluster: pgcluster.Cluster, table: str) -> dict[str, Any]:
    return {"kind": "postgres", "dsn": cluster.dsn(), "password_env": PASSWORD_ENV,
            "table": table}


def on_postgres(text: str, cluster: pgcluster.Cluster, tables: dict[str, str]) -> str:
    """The policy ``text`` with each named dataset's rows on PostgreSQL."""
    raw = yaml.safe_load(text)
    for name, table in tables.items():
        raw["datasets"][name]["engine"] = engine_spec(cluster, table)
    return yaml.safe_dump(raw, sort_keys=False)


def twin_stores(directory: Path, cluster: pgcluster.Cluster, name: str, policy: str,
                data: Path, na: str | None = None) -> tuple[Path, Path]:
    """A DuckDB store over ``data`` and a store whose dataset reads the same rows in PostgreSQL."""
    duck_policy, pg_policy = directory / f"{name}.yaml", directory / f"{name}_pg.yaml"
    duck_policy.write_text(policy)
    duck_path, pg_path = directory / f"{name}.duckdb", directory / f"{name}_pg.duckdb"
    store, _ = dpsql.init(duck_path, duck_policy, {name: data}, na=na)
    pgcluster.copy_table(cluster, store.cursor(), f"main.{name}", f"public.{name}")
    store.close()
    pg_policy.write_text(on_postgres(policy, cluster, {name: f"public.{name}"}))
    dpsql.init(pg_path, pg_policy)[0].close()
    return duck_path, pg_path


@pytest.fixture(scope="session")
def twins(pg: pgcluster.Cluster, tmp_path_factory: pytest.TempPathFactory
          ) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("pg")
    adult = with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE)
    acs = with_budgets(ACS_POLICY, budget=INFINITE, default=INFINITE)
    return {"adult": twin_stores(directory, pg, "adult", adult, ADULT_SAMPLE),
            "acs": twin_stores(directory, pg, "acs", acs, ACS_DATA, na="N")}


@pytest.mark.parametrize(("dataset", "sql"), CORPUS[::4])
def test_quick_corpus_identical_on_both_engines(twins: dict[str, tuple[Path, Path]],
                                                dataset: str, sql: str) -> None:
    check_identical(twins, dataset, sql)


@pytest.mark.parametrize(("dataset", "sql"), [
    ("adult", "SELECT race, COUNT(DISTINCT age), COUNT(DISTINCT sex) FILTER (WHERE age > 40) "
     "FROM adult GROUP BY race"),
    ("acs", "SELECT sex, COUNT(DISTINCT puma), COUNT(DISTINCT pincp), COUNT(DISTINCT noc) "
     "FROM acs WHERE agep > 30 GROUP BY sex")])
def test_distinct_counts_identical_on_both_engines(twins: dict[str, tuple[Path, Path]],
                                                   dataset: str, sql: str) -> None:
    check_identical(twins, dataset, sql)


@pytest.mark.slow
def test_corpus_identical_on_both_engines(twins: dict[str, tuple[Path, Path]]) -> None:
    assert len(CORPUS) >= 40
    for dataset, sql in CORPUS:
        check_identical(twins, dataset, sql)


# -- contribution bounding: the same kept rows ----------------------------------------------

BOUNDED_POLICY = """version: 1
accounting: pure
datasets:
  t:
    table: t
    privacy_unit: person
    max_rows: 2
    budget: {epsilon: .inf}
    engine: {kind: postgres, dsn_env: DPSQL_UNUSED, table: public.bounded}
    columns:
      person: {type: hidden}
      x: {type: float, bounds: [0, 1]}
      n: {type: integer, bounds: [0, 10]}
      s: {type: categorical, values: [a, b, "é", null]}
users:
  admin: {role: admin, budgets: {t: {epsilon: .inf}}}
"""


def test_bounding_keeps_the_same_rows_on_duckdb_and_postgres(pg: pgcluster.Cluster) -> None:
    dataset = Policy.from_text(BOUNDED_POLICY).dataset("t")
    duck = duckdb.connect()
    duck.execute("CREATE SCHEMA public")
    duck.execute(f"CREATE TABLE public.bounded AS {BOUNDED_ROWS}")
    pgcluster.copy_table(pg, duck, "public.bounded", "public.bounded")
    types = {n: str(t) for n, t in zip(*(lambda r: (r.columns, r.types))(
        duck.sql("SELECT * FROM public.bounded")), strict=True)}
    sql = f"SELECT person, x, n, s FROM {bounded_sql(dataset, 'the-secret', types)}"
    kept_duck = sorted(map(repr, duck.execute(sql).fetchall()))
    assert dataset.engine is not None
    engine = PostgresEngine(dataset.engine)
    os.environ["DPSQL_UNUSED"] = pg.dsn(password=pgcluster.READER_PASSWORD)
    try:
        kept_pg = sorted(map(repr, (tuple(r.values()) for r in engine.execute(
            sqlglot.parse_one(sql, read="duckdb")).to_pylist())))
    finally:
        engine.close()
    assert len(kept_duck) == 97 * 2  # every person has more than max_rows rows
    assert kept_pg == kept_duck
    other = f"SELECT person, x, n, s FROM {bounded_sql(dataset, 'another', types)}"
    assert sorted(map(repr, duck.execute(other).fetchall())) != kept_duck  # the key matters


# -- credentials, init checks, engine down, bounds, cancel, read only ------------------------

def test_password_is_never_shown(twins: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    path = twins["adult"][1]
    seen: list[str] = []
    with dpsql.connect(path, "alice") as session:
        seen.append(repr(session.sql("SELECT COUNT(*) FROM adult").as_dict()))
        seen.append(repr(session.sql("EXPLAIN PRIVACY SELECT SUM(age) FROM adult").as_dict()))
        seen.append(repr(session.sql("SHOW dpsql.datasets").as_dict()))
        with pytest.raises(DPSQLError) as err:
            session.sql("SELECT COUNT(*) FROM adult WHERE nope = 1")
        seen.append(str(err.value))
    with dpsql.connect(path, "admin") as admin:
        seen.append(repr(admin.store.cursor().sql("SELECT * FROM dpsql.audit").fetchall()))
        seen.append(admin.policy.text)
    shown = subprocess.run([sys.executable, "-m", "dpsql", "policy", "show", "--db", str(path)],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    seen.append(shown.stdout + shown.stderr)
    assert "user=reader" in seen[-1]  # the dsn (without its password) is shown
    for secret in SECRETS:
        assert not any(secret in text for text in seen)


def test_release_streams_the_same_source_from_postgres(twins: dict[str, tuple[Path, Path]],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A release on PostgreSQL exports the same bounded rows' counts as on DuckDB, in batches."""
    exported = record_streams(monkeypatch, {DuckDBEngine: 1 << 16, PostgresEngine: 100})
    for path in twins["adult"]:
        with dpsql.connect(path, "admin") as admin:
            admin.release("adult", synthesizer="independent", name="streamed", epsilon=1,
                          rows=300, columns=["age", "sex", "race"], replace=True)
            assert admin.store.cursor().execute("SELECT count(*) FROM released.streamed"
                                            ).fetchone() == (300,)
            record = repr(provenance.find(admin.store, "streamed"))
            assert pgcluster.READER_PASSWORD not in record
            assert "dsn" not in record
    assert len(exported[PostgresEngine]) > 2  # several round trips, never the whole table
    rows = exported_rows(exported[DuckDBEngine])
    assert len(rows) < 1000 < sum(row["rows"] for row in rows)  # counts, not rows
    assert exported_rows(exported[PostgresEngine]) == rows


def test_release_with_the_engine_down_charges_nothing(pg: pgcluster.Cluster, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with dpsql.connect(store_with_engine_down(pg, tmp_path, monkeypatch), "admin") as admin:
        before = admin.budget("admin")[0].spent
        with pytest.raises(ReleaseError, match=r"cannot be read.*nothing was charged") as err:
            admin.release("adult", synthesizer="independent", name="r", epsilon=1, rows=10)
        assert admin.budget("admin")[0].spent == before
        assert pgcluster.READER_PASSWORD not in str(err.value)


@pytest.mark.timeout(300)  # only the cancel ends the export: a hang guard
def test_cancel_stops_a_release_exporting_from_postgres(pg: pgcluster.Cluster,
                                                       twins: dict[str, tuple[Path, Path]],
                                                       tmp_path: Path) -> None:
    """A job cancelled while it streams its source stops the server's query at once."""
    with pg.admin() as con:  # the first row comes after an hour: only a cancel ends the export
        con.execute("CREATE OR REPLACE VIEW public.slow_adult AS SELECT * FROM public.adult "
                    "WHERE pg_sleep(3600)::text = ''")  # volatile: run for every row
        con.execute("GRANT SELECT ON public.slow_adult TO reader")
    policy = tmp_path / "slow.yaml"
    policy.write_text(on_postgres(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE),
                                  pg, {"adult": "public.slow_adult"}))
    dpsql.init(tmp_path / "slow.duckdb", policy)[0].close()
    with dpsql.connect(tmp_path / "slow.duckdb", "admin") as admin:
        job = admin.submit(ReleaseRequest("adult", "independent", "slow", epsilon=1,
                                          columns=["sex", "age"], rows=10))
        until(lambda: _active(pg, EXPORTING), "the export never started")
        admin.jobs().cancel(job, "admin")
        with pytest.raises(ReleaseError, match=r"was cancelled by admin; the charge of .* stays"):
            admin.jobs().wait(job)
        state = admin.store.cursor().execute("SELECT state FROM dpsql.jobs").fetchall()
        assert state == [("cancelled",)]
        assert admin.store.cursor().execute(
            "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'released'"
        ).fetchall() == [(0,)]
    assert not _active(pg, EXPORTING)


EXPORTING = "query LIKE '%dpsql_stream%'"  # the export's cursor: DECLARE or FETCH
SLEEPING = "application_name = 'dpsql' AND wait_event = 'PgSleep'"  # in pg_sleep()


def _active(cluster: pgcluster.Cluster, where: str) -> bool:
    """Whether the server runs a query (of another connection) that is ``where``."""
    with cluster.admin() as con:
        row = con.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND "
                          f"pid <> pg_backend_pid() AND {where}").fetchone()
    return bool(row and row[0])


def test_policy_refuses_a_password_in_the_dsn(pg: pgcluster.Cluster) -> None:
    raw = yaml.safe_load(BOUNDED_POLICY)
    for dsn in (pg.dsn(password="x"), "postgresql://reader:pw@127.0.0.1/postgres"):
        raw["datasets"]["t"]["engine"] = {"kind": "postgres", "dsn": dsn, "table": "public.t"}
        with pytest.raises(PolicyError, match="holds a password") as err:
            Policy.from_text(yaml.safe_dump(raw))
        assert "pw" not in str(err.value).replace("password", "")


@pytest.mark.parametrize(("table", "column", "message"), [
    ("public.missing", "age", "no table public.missing"),
    ("public.adult", "not_there", "has no such column"),
])
def test_init_checks_the_engine_table(pg: pgcluster.Cluster, twins: Any, tmp_path: Path,
                                      table: str, column: str, message: str) -> None:
    raw = yaml.safe_load(BOUNDED_POLICY)
    raw["datasets"]["t"]["engine"] = engine_spec(pg, table)
    raw["datasets"]["t"]["privacy_unit"] = None
    raw["datasets"]["t"]["max_rows"] = 1
    raw["datasets"]["t"]["columns"] = {column: {"type": "integer", "bounds": [0, 99]}}
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump(raw))
    with pytest.raises(PolicyError, match=message):
        dpsql.init(tmp_path / "s.duckdb", policy)
    assert not (tmp_path / "s.duckdb").exists()


def dpsql_backends(pg: pgcluster.Cluster) -> list[int]:
    """Process ids of the server's connections that dpsql opened."""
    with pg.admin() as con:
        return [row[0] for row in con.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'dpsql'").fetchall()]


def test_a_session_keeps_one_connection_and_replaces_a_broken_one(
        twins: dict[str, tuple[Path, Path]], pg: pgcluster.Cluster) -> None:
    # A closed connection's server process ends after the client has gone on: wait for
    # those of earlier tests, and for each one this test ends, before counting.
    until(lambda: dpsql_backends(pg) == [], "an earlier test's connection stayed open")
    with dpsql.connect(twins["adult"][1], "alice") as alice:
        first = alice.sql("SELECT sex, COUNT(*) FROM adult GROUP BY sex").table.to_pylist()
        kept = dpsql_backends(pg)
        assert len(kept) == 1  # kept between statements, idle
        alice.sql("SELECT SUM(age) FROM adult WHERE age > 3")  # its prepared names are free
        assert dpsql_backends(pg) == kept
        with pg.admin() as con:  # as a server restart would: the kept connection breaks
            ended = con.execute("SELECT pg_terminate_backend(%s, 60000)", (kept[0],)).fetchone()
        assert ended == (True,)  # waited until the process ended
        before = len(alice.audit())
        again = alice.sql("SELECT sex, COUNT(*) FROM adult GROUP BY sex")  # from the cache
        fresh = alice.sql("SELECT race, COUNT(*) FROM adult GROUP BY race")
        assert again.table.to_pylist() == first
        assert not fresh.cached
        assert len(alice.audit()) == before + 2
        replaced = dpsql_backends(pg)
        assert len(replaced) == 1
        assert replaced != kept
    until(lambda: dpsql_backends(pg) == [], "the session's connection stayed open after it")


def store_with_engine_down(pg: pgcluster.Cluster, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store whose Adult dataset is on PostgreSQL, whose DSN now names a port nobody serves."""
    raw = yaml.safe_load(with_budgets(ADULT_POLICY, budget={"epsilon": 5},
                                   default={"epsilon": 1}))
    raw["datasets"]["adult"]["engine"] = {"kind": "postgres", "dsn_env": "DPSQL_TEST_PG_DSN",
                                          "table": "public.adult"}
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("DPSQL_TEST_PG_DSN", pg.dsn(password=pgcluster.READER_PASSWORD))
    dpsql.init(tmp_path / "s.duckdb", policy)[0].close()
    nowhere = pgcluster.Cluster(1).dsn(password=pgcluster.READER_PASSWORD)  # nothing listens
    monkeypatch.setenv("DPSQL_TEST_PG_DSN", nowhere)
    return tmp_path / "s.duckdb"


def test_engine_down_charges_nothing(pg: pgcluster.Cluster, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with dpsql.connect(store_with_engine_down(pg, tmp_path, monkeypatch), "alice") as alice:
        before = alice.budget()[0].remaining
        with pytest.raises(InternalError, match=r"server is down.*nothing was charged") as err:
            alice.sql("SELECT COUNT(*) FROM adult")
        assert alice.budget()[0].remaining == before
        assert pgcluster.READER_PASSWORD not in str(err.value)
        monkeypatch.setenv("DPSQL_TEST_PG_DSN", pg.dsn(password=pgcluster.READER_PASSWORD))
        alice.sql("SELECT COUNT(*) FROM adult")
        assert alice.budget()[0].remaining < before


@pytest.mark.parametrize("condition", [
    "pincp * 1e300 > 0", "agep / (agep - 40) > 1", "pincp + pincp > 0", "agep / 0 > 1",
    "density / 1e-300 > 1",
])
def test_arithmetic_that_could_raise_is_refused_before_the_charge(
        twins: dict[str, tuple[Path, Path]], condition: str) -> None:
    with dpsql.connect(twins["acs"][1], "alice") as session:
        before = session.budget()[0].spent
        with pytest.raises(QueryRejected, match="could overflow or divide by zero"):
            session.sql(f"SELECT COUNT(*) FROM acs WHERE {condition}")
        assert session.budget()[0].spent == before


@pytest.mark.parametrize("sql", [
    "SELECT MEDIAN(agep) FROM acs", "SELECT sex, MAX(pincp) FROM acs GROUP BY sex",
    "EXPLAIN PRIVACY SELECT QUANTILE_CONT(agep, 0.9) FROM acs",
])
def test_a_quantile_is_refused_before_the_charge(twins: dict[str, tuple[Path, Path]],
                                                 sql: str) -> None:
    """DuckDB answers it; PostgreSQL has no DP quantile (histogram() is DuckDB's) yet."""
    with dpsql.connect(twins["acs"][0], "alice") as session:
        session.sql(sql)
    with dpsql.connect(twins["acs"][1], "alice") as session:
        before = charges(session)
        with pytest.raises(QueryRejected, match="PostgreSQL, where dpsql has no DP quantile"):
            session.sql(sql)
        assert charges(session) == before


def test_enforced_bounds_from_check_constraints(pg: pgcluster.Cluster) -> None:
    with pg.admin() as con:
        con.execute("CREATE TABLE public.checked (a integer CHECK (a BETWEEN 0 AND 9), "
                    "b double precision CHECK (b >= -1.5 AND b <= 2), c integer CHECK (c > 0), "
                    "d integer)")
        con.execute("ALTER TABLE public.checked ADD CHECK (d >= 0 AND d <= 5) NOT VALID")
        con.execute("GRANT SELECT ON public.checked TO reader")
    spec = Policy.from_text(on_postgres(BOUNDED_POLICY, pg, {"t": "public.checked"})
                            ).dataset("t").engine
    assert spec is not None
    engine = PostgresEngine(spec)
    try:
        bounds = engine.enforced_bounds("t")
    finally:
        engine.close()
    assert bounds == {"a": (0, 9), "b": (-1.5, 2)}  # c: not a range; d: not validated
    assert range_check("CHECK (((x <= 3) AND (x >= 1)))") == ("x", 1, 3)
    assert range_check("CHECK (((x <= 3) AND (y >= 1)))") is None


@pytest.mark.timeout(120)  # only the cancel ends pg_sleep(3600): a hang guard
def test_cancel_reaches_the_server(pg: pgcluster.Cluster) -> None:
    spec = Policy.from_text(on_postgres(BOUNDED_POLICY, pg, {"t": "public.bounded"})
                            ).dataset("t").engine
    assert spec is not None
    interrupts = Interrupter()
    engine = PostgresEngine(spec, interrupts)

    def interrupt_once_running() -> None:
        until(lambda: _active(pg, SLEEPING), "the query never started")
        interrupts.interrupt()

    interrupter = threading.Thread(target=interrupt_once_running, daemon=True)
    try:
        with interrupts.statement():
            interrupter.start()
            with pytest.raises(QueryCanceled):
                engine.execute(sqlglot.parse_one("SELECT pg_sleep(3600)", read="postgres"))
    finally:
        engine.close()
    interrupter.join()
    assert not _active(pg, SLEEPING)


def test_snapshot_is_read_only(pg: pgcluster.Cluster) -> None:
    os.environ["DPSQL_TEST_PG_SUPER"] = pg.dsn("postgres", pgcluster.SUPER_PASSWORD)
    raw = yaml.safe_load(BOUNDED_POLICY)
    raw["datasets"]["t"]["engine"] = {"kind": "postgres", "dsn_env": "DPSQL_TEST_PG_SUPER",
                                      "table": "public.bounded"}
    spec = Policy.from_text(yaml.safe_dump(raw)).dataset("t").engine
    assert spec is not None
    engine = PostgresEngine(spec)
    try:
        with pytest.raises(EngineError, match="read-only transaction"):
            engine.execute(sqlglot.parse_one("DELETE FROM public.bounded"))
    finally:
        engine.close()



@pytest.mark.parametrize("pattern", ["%\\", "%\\%%", "%-0%"])
def test_like_reads_backslash_as_duckdb_does(twins: dict[str, tuple[Path, Path]],
                                             pattern: str) -> None:
    # PostgreSQL's LIKE escapes with a backslash by default, and raises on the rows that
    # reach a pattern ending in one (an error that depends on the rows, after the charge).
    # DuckDB's LIKE has no escape character; the rendering gives PostgreSQL none either.
    check_identical(twins, "acs", f"SELECT COUNT(*) FROM acs WHERE puma LIKE '{pattern}' OR "
                                  f"puma ILIKE '{pattern}'")

