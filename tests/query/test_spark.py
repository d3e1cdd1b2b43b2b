"""SparkEngine on a real local[2] Spark session (one per test module).

The same policies and data on DuckDB and on Spark (a Parquet path, and a table
of the Spark catalog) give identical exact answers (unbounded budgets: no
noise); contribution bounding keeps the same rows on both, and a release
streams them in Arrow batches; a missing path or table charges nothing, a Spark
failure after a release's charge keeps it and tells nothing of the rows; a
cancel stops the statement's Spark jobs.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlglot
import yaml

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'dpsql[spark]')")

import dpsql
from dpsql.engine_spec import EngineSpec
from dpsql.engines.base import EngineError
from dpsql.engines.interrupt import Interrupter
from dpsql.engines.local import DuckDBEngine
from dpsql.engines.source import bounded_sql
from dpsql.engines.spark import SparkEngine, session, to_spark
from dpsql.errors import (
    InternalError,
    PolicyError,
    QueryCanceled,
    QueryRejected,
    ReleaseError,
)
from dpsql.policy import Policy
from tests.conftest import ADULT_POLICY, ADULT_SAMPLE
from tests.query.conftest import ACS_DATA, ACS_POLICY, INFINITE, with_budgets
from tests.query.engine_corpus import (
    BOUNDED_ROWS,
    CORPUS,
    check_identical,
    exported_rows,
    record_streams,
)
from tests.waits import until

LOCAL = {"kind": "spark", "master": "local[2]"}


@pytest.fixture(scope="module")
def spark() -> Any:
    spark = session(EngineSpec(kind="spark", table="unused", master="local[2]"))
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def on_spark(text: str, engines: dict[str, dict[str, str]]) -> str:
    """The policy ``text`` with each named dataset's rows on Spark."""
    raw = yaml.safe_load(text)
    for name, where in engines.items():
        raw["datasets"][name]["engine"] = {**LOCAL, **where}
    return yaml.safe_dump(raw, sort_keys=False)


def to_parquet(cursor: duckdb.DuckDBPyConnection, table: str, path: Path) -> Path:
    """Write ``table`` (through Arrow: the store's connection writes no files) to ``path``."""
    pq.write_table(cursor.sql(f"SELECT * FROM {table}").to_arrow_table(), path)
    return path


def twin_stores(directory: Path, spark: Any, name: str, policy: str, data: Path,
                na: str | None = None, catalog: bool = False) -> tuple[Path, Path]:
    """A DuckDB store over ``data`` and a store whose dataset reads the same rows in Spark.

    ``catalog``: the Spark dataset names a table of the session's catalog (a view of
    the Parquet file) instead of the Parquet path.
    """
    duck_policy, spark_policy = directory / f"{name}.yaml", directory / f"{name}_spark.yaml"
    duck_policy.write_text(policy)
    duck_path, spark_path = directory / f"{name}.duckdb", directory / f"{name}_spark.duckdb"
    store, _ = dpsql.init(duck_path, duck_policy, {name: data}, na=na)
    parquet = to_parquet(store.cursor(), f"main.{name}", directory / f"{name}.parquet")
    store.close()
    where = {"path": str(parquet)}
    if catalog:
        spark.read.parquet(str(parquet)).createOrReplaceTempView(f"{name}_rows")
        where = {"table": f"{name}_rows"}
    spark_policy.write_text(on_spark(policy, {name: where}))
    dpsql.init(spark_path, spark_policy)[0].close()
    return duck_path, spark_path


@pytest.fixture(scope="module")
def twins(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("spark")
    adult = with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE)
    acs = with_budgets(ACS_POLICY, budget=INFINITE, default=INFINITE)
    return {"adult": twin_stores(directory, spark, "adult", adult, ADULT_SAMPLE),
            "acs": twin_stores(directory, spark, "acs", acs, ACS_DATA, na="N", catalog=True)}


@pytest.mark.parametrize(("dataset", "sql"), CORPUS[::4])
def test_quick_corpus_identical_on_both_engines(twins: dict[str, tuple[Path, Path]],
                                                dataset: str, sql: str) -> None:
    check_identical(twins, dataset, sql)


@pytest.mark.slow
def test_corpus_identical_on_both_engines(twins: dict[str, tuple[Path, Path]]) -> None:
    assert len(CORPUS) >= 40
    for dataset, sql in CORPUS:
        check_identical(twins, dataset, sql)


@pytest.mark.parametrize("pattern", ["%\\", "%\\%%", "%-0%"])
def test_like_reads_backslash_as_duckdb_does(twins: dict[str, tuple[Path, Path]],
                                             pattern: str) -> None:
    # Spark's LIKE escapes with a backslash (and raises on a pattern ending in one);
    # DuckDB's has no escape character: the rendering doubles the backslashes.
    check_identical(twins, "acs", f"SELECT COUNT(*) FROM acs WHERE puma LIKE '{pattern}' OR "
                                  f"puma ILIKE '{pattern}'")


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM adult WHERE age / 3.0 * 3 = age",
    "SELECT COUNT(*) FROM adult WHERE round(age / 7.0, 3) * 7 > age",
])
def test_division_is_in_doubles_as_in_duckdb(twins: dict[str, tuple[Path, Path]],
                                             sql: str) -> None:
    # Spark divides decimals as decimals (28 / 3.0 * 3 = 27.999999 there); DuckDB in DOUBLE.
    check_identical(twins, "adult", sql)


@pytest.mark.parametrize("condition", ["agep / (agep - 40) > 1", "pincp * 1e300 > 0"])
def test_arithmetic_that_could_raise_is_refused_before_the_charge(
        twins: dict[str, tuple[Path, Path]], condition: str) -> None:
    # Spark's ANSI mode raises on a division by zero and on overflow, DuckDB does not.
    with dpsql.connect(twins["acs"][1], "alice") as session_:
        before = session_.budget()[0].spent
        with pytest.raises(QueryRejected, match="divide by zero on dataset acs, whose rows are "
                                                "in Spark"):
            session_.sql(f"SELECT COUNT(*) FROM acs WHERE {condition}")
        assert session_.budget()[0].spent == before


BIG_POLICY = """version: 1
accounting: pure
datasets:
  big:
    table: big
    budget: {epsilon: .inf}
    default_query: {epsilon: .inf}
    columns:
      n: {type: integer, bounds: [0, 4000000000000000]}
users:
  admin: {role: admin, budgets: {big: {epsilon: .inf}}}
  alice: {role: analyst, budgets: {big: {epsilon: .inf}}}
"""


def test_a_total_beyond_bigint_is_capped_as_on_duckdb(spark: Any, tmp_path: Path) -> None:
    # 3,000 x 4e15 overflows BIGINT: Spark's SUM of BIGINT raises (ANSI), after the charge.
    data = tmp_path / "big.csv"
    data.write_text("n\n" + "4000000000000000\n" * 3000)
    twins = {"big": twin_stores(tmp_path, spark, "big", BIG_POLICY, data)}
    check_identical(twins, "big", "SELECT SUM(n), COUNT(*) FROM big")


# -- contribution bounding: the same kept rows ----------------------------------------------

BOUNDED_POLICY = """version: 1
accounting: pure
datasets:
  t:
    table: t
    privacy_unit: person
    max_rows: 2
    budget: {epsilon: .inf}
    engine: {kind: spark, path: PATH}
    columns:
      person: {type: hidden}
      x: {type: float, bounds: [0, 1]}
      n: {type: integer, bounds: [0, 10]}
      s: {type: categorical, values: [a, b, "é", null]}
users:
  admin: {role: admin, budgets: {t: {epsilon: .inf}}}
"""


def test_bounding_keeps_the_same_rows_on_duckdb_and_spark(spark: Any, tmp_path: Path) -> None:
    parquet = tmp_path / "bounded.parquet"
    dataset = Policy.from_text(BOUNDED_POLICY.replace("PATH", str(parquet))).dataset("t")
    assert dataset.engine is not None
    view = dataset.engine.name_parts[0]  # the name the SQL reads, on both engines
    duck = duckdb.connect()
    duck.execute(f"CREATE TABLE {view} AS {BOUNDED_ROWS}")
    to_parquet(duck, view, parquet)
    types = {n: str(t) for n, t in zip(*(lambda r: (r.columns, r.types))(
        duck.sql(f"SELECT * FROM {view}")), strict=True)}
    sql = f"SELECT person, x, n, s FROM {bounded_sql(dataset, 'the-secret', types)}"
    kept_duck = sorted(map(repr, duck.execute(sql).fetchall()))
    engine = SparkEngine(dataset.engine)
    try:
        assert engine.column_types("t") == types
        query = sqlglot.parse_one(sql, read="duckdb")
        kept_spark = sorted(map(repr, (tuple(r.values()) for r in engine.execute(
            query).to_pylist())))
        schema = duck.sql(sql).to_arrow_table().schema
        streamed = pa.Table.from_batches(engine.stream(query, schema, size=50), schema)
        assert sorted(map(repr, (tuple(r.values()) for r in streamed.to_pylist()))) == kept_duck
    finally:
        engine.close()
    assert len(kept_duck) == 97 * 2  # every person has more than max_rows rows
    assert kept_spark == kept_duck
    other = f"SELECT person, x, n, s FROM {bounded_sql(dataset, 'another', types)}"
    assert sorted(map(repr, duck.execute(other).fetchall())) != kept_duck  # the key matters


# -- policy, missing data, release, cancel, read only ----------------------------------------

@pytest.mark.parametrize(("engine", "message"), [
    ({"kind": "spark"}, "exactly one of table"),
    ({"kind": "spark", "table": "t", "path": "/x.parquet"}, "exactly one of table"),
    ({"kind": "spark", "table": "t", "dsn_env": "X"}, "takes no connection string"),
    ({"kind": "postgres", "dsn_env": "X", "path": "/x", "table": "public.t"}, "Spark settings"),
    ({"kind": "postgres", "dsn_env": "X", "table": "t"}, "schema.table"),
    ({"kind": "hive", "table": "t"}, "hive"),
])
def test_policy_refuses_a_wrong_engine(engine: dict[str, str], message: str) -> None:
    raw = yaml.safe_load(BOUNDED_POLICY)
    raw["datasets"]["t"]["engine"] = engine
    with pytest.raises(PolicyError, match=message):
        Policy.from_text(yaml.safe_dump(raw))


@pytest.mark.parametrize(("where", "message"), [
    ({"path": "/nonexistent/x.parquet"}, "no table Parquet /nonexistent/x.parquet on Spark"),
    ({"table": "not_a_table"}, "no table not_a_table on Spark"),
])
def test_init_checks_the_spark_table(spark: Any, tmp_path: Path, where: dict[str, str],
                                     message: str) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(on_spark(BOUNDED_POLICY, {"t": where}))
    with pytest.raises(PolicyError, match=message):
        dpsql.init(tmp_path / "s.duckdb", policy)
    assert not (tmp_path / "s.duckdb").exists()


def test_missing_data_charges_nothing_for_a_query_or_a_release(spark: Any, tmp_path: Path) -> None:
    parquet = tmp_path / "adult.parquet"
    duck = duckdb.connect()
    duck.execute(f"CREATE TABLE adult AS SELECT * FROM read_csv('{ADULT_SAMPLE}')")
    to_parquet(duck, "adult", parquet)
    policy = tmp_path / "p.yaml"
    policy.write_text(on_spark(with_budgets(ADULT_POLICY, budget={"epsilon": 5},
                                            default={"epsilon": 1}),
                               {"adult": {"path": str(parquet)}}))
    dpsql.init(tmp_path / "s.duckdb", policy)[0].close()
    moved = parquet.rename(tmp_path / "elsewhere.parquet")
    with dpsql.connect(tmp_path / "s.duckdb", "alice") as alice:
        before = alice.budget()[0].remaining
        with pytest.raises(InternalError, match=r"cannot be read.*nothing was charged"):
            alice.sql("SELECT COUNT(*) FROM adult")
        assert alice.budget()[0].remaining == before
        with dpsql.connect(tmp_path / "s.duckdb", "admin") as admin:
            spent = admin.budget("admin")[0].spent
            with pytest.raises(ReleaseError, match=r"cannot be read.*nothing was charged"):
                admin.release("adult", synthesizer="independent", name="r", epsilon=1, rows=10)
            assert admin.budget("admin")[0].spent == spent
        moved.rename(parquet)
        alice.sql("SELECT COUNT(*) FROM adult")
        assert alice.budget()[0].remaining < before


def test_release_streams_the_same_source_from_spark(twins: dict[str, tuple[Path, Path]],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A release on Spark exports the same counts of bounded rows as on DuckDB, in Arrow batches.

    The release's noisy measurements are functions of these rows alone, so they
    measure the same marginals before noise on both engines.
    """
    exported = record_streams(monkeypatch, {DuckDBEngine: 1 << 16, SparkEngine: 100})
    for path in twins["adult"]:
        with dpsql.connect(path, "admin") as admin:
            before = admin.budget("admin")[0].spent
            admin.release("adult", synthesizer="independent", name="streamed", epsilon=1,
                          rows=300, columns=["age", "sex", "race"], replace=True, seed=7)
            assert admin.budget("admin")[0].spent > before
            assert admin.store.cursor().execute("SELECT count(*) FROM released.streamed"
                                                ).fetchone() == (300,)
    assert len(exported[SparkEngine]) > 2  # several batches, never the whole table at once
    rows = exported_rows(exported[DuckDBEngine])
    assert len(rows) < 1000 < sum(row["rows"] for row in rows)  # counts, not rows
    assert exported_rows(exported[SparkEngine]) == rows


FAILING_POLICY = """version: 1
accounting: pure
datasets:
  t:
    table: t
    budget: {epsilon: 5}
    engine: {kind: spark, table: failing_rows}
    synthesizers: [independent]
    columns:
      n: {type: integer, bounds: [0, 10]}
      s: {type: categorical, values: [a, b]}
users:
  admin: {role: admin, budgets: {t: {epsilon: 5}}}
"""


def test_a_spark_failure_after_the_charge_keeps_the_charge(spark: Any, tmp_path: Path) -> None:
    # The view binds (its schema is known) and raises on one row when a job reads it.
    spark.sql("CREATE OR REPLACE TEMP VIEW failing_rows AS SELECT CAST(id % 11 AS INT) AS n, "
              "CASE WHEN id = 4321 THEN raise_error('row 4321 is secret') ELSE 'a' END AS s "
              "FROM range(0, 10000)")
    policy = tmp_path / "p.yaml"
    policy.write_text(FAILING_POLICY)
    dpsql.init(tmp_path / "s.duckdb", policy)[0].close()
    with dpsql.connect(tmp_path / "s.duckdb", "admin") as admin:
        before = admin.budget("admin")[0].spent
        with pytest.raises(ReleaseError, match=r"the release failed \(EngineError\); nothing "
                                               r"was written; the charge of .* stays") as err:
            admin.release("t", synthesizer="independent", name="r", epsilon=1, rows=10)
        assert "secret" not in str(err.value)
        assert admin.budget("admin")[0].spent > before
        assert admin.store.cursor().execute(
            "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'released'"
        ).fetchone() == (0,)


@pytest.mark.timeout(300)  # only the cancel ends the job (years of rows): a hang guard
def test_cancel_reaches_spark(spark: Any) -> None:
    interrupts = Interrupter()
    engine = SparkEngine(EngineSpec(kind="spark", table="unused"), interrupts)
    endless = sqlglot.parse_one("SELECT SUM(id % 7) AS s FROM range(0, 1000000000000000000)",
                                read="spark")
    tracker, over = spark.sparkContext.statusTracker(), threading.Event()

    def interrupt_once_running() -> None:
        while not tracker.getActiveJobsIds():
            if over.wait(0.05):  # it failed before its job started: nothing to interrupt
                return
        interrupts.interrupt()

    interrupter = threading.Thread(target=interrupt_once_running, daemon=True)
    try:
        with interrupts.statement():
            interrupter.start()
            with pytest.raises(QueryCanceled):
                engine.execute(endless)
    finally:
        over.set()
        engine.close()
    interrupter.join()
    until(lambda: not tracker.getActiveJobsIds(), "the cancelled job went on")


@pytest.mark.parametrize(("rows", "size"), [(2500, 1000), (25000, 3000)])
def test_stream_gives_batches_of_at_most_size_rows(spark: Any, rows: int, size: int) -> None:
    # Spark's Arrow batches hold 10,000 rows: each partition's are cut and joined into chunks.
    engine = SparkEngine(EngineSpec(kind="spark", table="unused"))
    schema = pa.schema([("id", pa.int64()), ("half", pa.float64())])
    query = sqlglot.parse_one(f"SELECT id, id / 2 AS half FROM range(0, {rows})", read="spark")
    try:
        batches = list(engine.stream(query, schema, size=size))
    finally:
        engine.close()
    partition = rows // spark.sparkContext.defaultParallelism
    expected = [size] * (partition // size) + [partition % size]
    assert sorted(b.num_rows for b in batches) == sorted(
        expected * spark.sparkContext.defaultParallelism)  # the chunks, in any order
    table = pa.Table.from_batches(batches, schema)
    assert sorted(table["id"].to_pylist()) == list(range(rows))
    assert table["half"].to_pylist() == [i / 2 for i in table["id"].to_pylist()]


def test_only_queries_run(spark: Any) -> None:
    engine = SparkEngine(EngineSpec(kind="spark", table="unused"))
    try:
        for statement in ("CREATE TABLE dpsql_nope (a INT)", "DROP TABLE IF EXISTS x"):
            with pytest.raises(EngineError, match="only queries"):
                engine.execute(sqlglot.parse_one(statement, read="spark"))
    finally:
        engine.close()
    assert not spark.catalog.tableExists("dpsql_nope")


def test_rendering_drops_the_collation() -> None:
    query = sqlglot.parse_one("SELECT a FROM t ORDER BY md5(b) COLLATE \"C\"", read="duckdb")
    assert to_spark(query).sql(dialect="spark") == "SELECT a FROM t ORDER BY MD5(b) NULLS LAST"
