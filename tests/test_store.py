"""The governed store: creation, owners' migrations, services, hardening, imports, locking."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from collections.abc import Callable

import duckdb
import pytest

import dpsql
from dpsql import store as store_tables
from dpsql.errors import ConfigurationError, PolicyError, StoreError
from dpsql.imports import IMPORT_LIMITS, import_table, normalize_name, table_columns, tables
from dpsql.jobs import JOBS, JobState
from dpsql.ledger.books import BOOKS, Books
from dpsql.outcomes import Outcome
from dpsql.outside import DomainError
from dpsql.policies import active_policy, check_policy, policy_history
from dpsql.policy import Policy
from dpsql.query.free import FREE, FreeDatabase
from dpsql.sandbox import SANDBOXES
from dpsql.services import OWNERS, open_store
from dpsql.store import Store, StoreKey, schema_version

from .conftest import ADULT_POLICY, ADULT_SAMPLE, policy_text


def test_create_records_schema_version_and_secret(store_path):
    with open_store(store_path) as store:
        meta = dict(store.cursor().execute("SELECT key, value FROM dpsql.meta").fetchall())
        assert meta["schema_version"] == str(schema_version(OWNERS))
        assert len(meta["secret"]) == 64
        assert tables(store) == ["adult"]
        assert active_policy(store).fingerprint == Policy.load(ADULT_POLICY).fingerprint


def test_open_is_shared_within_a_process(store_path):
    a = open_store(store_path)
    b = open_store(store_path)
    assert a is b
    a.close()
    assert b.cursor().execute("SELECT 1").fetchone() == (1,)
    b.close()


def test_a_hard_link_opens_the_same_store(store_path):
    link = store_path.with_name("linked.duckdb")
    link.hardlink_to(store_path)
    with dpsql.connect(store_path, "alice") as direct, dpsql.connect(link, "alice") as linked:
        assert direct.store is linked.store
        before = linked.budget()[0].spent
        direct.sql("SELECT COUNT(*) FROM adult")
        assert linked.budget()[0].spent > before  # the charge is seen through the link


@pytest.mark.parametrize("statement", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "COPY adult TO '/tmp/leak.csv'",
    "ATTACH '/tmp/other.duckdb'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "SET threads = 1",
])
def test_every_connection_is_hardened(store_path, statement):
    with open_store(store_path) as store, pytest.raises(duckdb.Error):
        store.cursor().execute(statement)


def test_second_process_gets_a_clear_error(store_path):
    code = textwrap.dedent(f"""
        import dpsql, sys
        from dpsql.services import open_store
        try:
            open_store({str(store_path)!r})
        except dpsql.StoreError as err:
            print(err); sys.exit(9)
    """)
    with open_store(store_path):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=60)
    assert result.returncode == 9, result.stderr
    assert "open for writing by another process" in result.stdout


def test_foreign_duckdb_file_is_refused(tmp_path):
    path = tmp_path / "foreign.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t AS SELECT 1 AS x")
    con.close()
    with pytest.raises(StoreError, match="not a dpsql store"):
        open_store(path)


def test_corrupt_file_is_refused(tmp_path):
    path = tmp_path / "corrupt.duckdb"
    path.write_bytes(b"this is not a database" * 1000)
    with pytest.raises(StoreError, match="not a readable DuckDB database"):
        open_store(path)


def test_missing_store_says_how_to_create(tmp_path):
    with pytest.raises(StoreError, match="dpsql init"):
        open_store(tmp_path / "nope.duckdb")


def test_newer_schema_is_refused(store_path):
    with open_store(store_path) as store:
        store.cursor().execute("UPDATE dpsql.meta SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="upgrade dpsql"):
        open_store(store_path)


def test_import_normalizes_names_and_refuses_overwrite(store_path, tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("Income>50K,Hours per week\n1,40\n0,20\n")
    with open_store(store_path) as store:
        renames = import_table(store, "extra", csv)
        assert renames == {"Income>50K": "income_50k", "Hours per week": "hours_per_week"}
        assert list(table_columns(store, "extra")) == ["income_50k", "hours_per_week"]
        with pytest.raises(ConfigurationError, match="--replace"):
            import_table(store, "extra", csv)
        with pytest.raises(ConfigurationError, match="valid identifier"):
            import_table(store, "bad name", csv)
    assert normalize_name("2019 total") == "c_2019_total"


def test_import_reads_na_as_null(store_path, tmp_path):
    csv = tmp_path / "n.csv"
    csv.write_text("a,b\nN,1\n2,N\n")
    with open_store(store_path) as store:
        import_table(store, "n", csv, na="N")
        rows = store.cursor().execute("SELECT a, b FROM n ORDER BY b NULLS LAST").fetchall()
    assert rows == [(None, 1), (2, None)]


def _main_tables(store: Store) -> list[str]:
    return [r[0] for r in store.cursor().execute(
        "SELECT schema_name || '.' || table_name FROM duckdb_tables() ORDER BY 1").fetchall()
        if not r[0].startswith("dpsql.") or r[0] == "dpsql.import_staged"]


def test_import_streams_batches_and_keeps_types_and_rows(store_path, tmp_path, monkeypatch):
    monkeypatch.setattr("dpsql.imports.IMPORT_BATCH_ROWS", 3)  # the 10 rows in 4 batches
    data = tmp_path / "t.parquet"
    duckdb.sql(f"COPY (SELECT i::INTEGER AS n, 'v' || i AS s, i / 4 AS x FROM range(10) t(i)) "
               f"TO '{data}' (FORMAT parquet)")
    with open_store(store_path) as store:
        import_table(store, "t", data, bounds={"n": (0, 9)})
        assert table_columns(store, "t") == {"n": "INTEGER", "s": "VARCHAR", "x": "DOUBLE"}
        rows = store.cursor().execute("SELECT n, s, x FROM t ORDER BY n").fetchall()
        assert rows == [(i, f"v{i}", i / 4) for i in range(10)]
        assert "main.t" in _main_tables(store)
        assert "dpsql.import_staged" not in _main_tables(store)


def test_import_of_a_header_only_file_keeps_its_columns(store_path, tmp_path):
    csv = tmp_path / "h.csv"
    csv.write_text("a,b\n")
    with open_store(store_path) as store:
        import_table(store, "h", csv)
        assert list(table_columns(store, "h")) == ["a", "b"]
        assert store.cursor().execute("SELECT count(*) FROM h").fetchone() == (0,)


@pytest.mark.parametrize("bounds", [None, {"a": (0, 10)}], ids=["direct", "staged"])
def test_a_bad_value_after_some_batches_leaves_nothing_behind(store_path, tmp_path,
                                                              monkeypatch, bounds):
    monkeypatch.setattr("dpsql.imports.IMPORT_BATCH_ROWS", 1000)
    csv = tmp_path / "late.csv"  # past the rows DuckDB's sniffer reads: found while streaming
    csv.write_text("a,b\n" + "1,2\n" * 30_000 + "x,2\n")
    with open_store(store_path) as store:
        import_table(store, "late", ADULT_SAMPLE)
        before = _main_tables(store)
        with pytest.raises(ConfigurationError, match=r"cannot read .*late\.csv"):
            import_table(store, "late", csv, replace=True, bounds=bounds)
        assert _main_tables(store) == before
        assert store.cursor().execute("SELECT count(*) FROM late").fetchone() == (5000,)


def test_policy_must_match_the_tables(store_path):
    with open_store(store_path) as store:
        missing_col = Policy.from_text(policy_text(columns="\n      salary: {type: float, "
                                                   "bounds: [0, 1]}"))
        with pytest.raises(PolicyError, match="has no such column"):
            check_policy(store, missing_col)
        wrong_type = Policy.from_text(policy_text(columns="\n      sex: {type: categorical, "
                                                  "values: ['M', 'F']}"))
        with pytest.raises(PolicyError, match="values must be numbers"):
            check_policy(store, wrong_type)
        notes = check_policy(store, Policy.from_text(policy_text()))
        assert any("hidden" in n and "workclass" in n for n in notes)


def test_failed_init_leaves_nothing(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text(policy_text(columns="\n      salary: {type: float, bounds: [0, 1]}"))
    target = tmp_path / "s.duckdb"
    with pytest.raises(PolicyError):
        dpsql.init(target, bad, {"adult": ADULT_SAMPLE})
    assert not target.exists()


def test_policy_history_keeps_every_version(admin, tmp_path):
    new = tmp_path / "new.yaml"
    new.write_text(ADULT_POLICY.read_text().replace("adult: {epsilon: 2}", "adult: {epsilon: 3}"))
    changes = admin.apply_policy(new)
    assert any("users.alice.budgets.adult.epsilon: 2 -> 3" in c for c in changes)
    history = policy_history(admin.store)
    assert [h.version for h in history] == [1, 2]
    assert [h.applied_by for h in history] == ["admin", "admin"]
    assert history[1].text == new.read_text()
    assert admin.policy.users["alice"].budgets["adult"] == admin.cost(epsilon=3)


def test_init_hands_back_a_store_without_the_import_limits(tmp_path):
    setting = "SELECT current_setting('memory_limit'), current_setting('threads')"
    with duckdb.connect(config=IMPORT_LIMITS) as capped:
        import_limit = capped.execute(setting).fetchone()
    store, _ = dpsql.init(tmp_path / "s.duckdb", ADULT_POLICY, {"adult": ADULT_SAMPLE})
    with store:
        assert store.cursor().execute(setting).fetchone() != import_limit


# Prints the peak resident memory (kB) of the command it runs (a fresh wrapper process
# each time: RUSAGE_CHILDREN keeps the largest child a process ever waited for).
PEAK = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
        "capture_output=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
WIDE = """version: 1
accounting: zcdp
delta: 1.0e-6
datasets:
  wide:
    table: wide
    budget: {epsilon: 1}
    columns:
      v: {type: integer, bounds: [0, 49]}
      a: {type: hidden}
      b: {type: hidden}
users:
  admin: {role: admin, budgets: {wide: {epsilon: 1}}}
"""


@pytest.mark.slow
def test_init_memory_does_not_grow_with_rows(tmp_path):
    """Peak memory of ``dpsql init`` at 3M and 9M random (incompressible) rows, half of them
    dropped as outside, scattered. Both fill the import's memory limit (24 bytes a row);
    without it DuckDB's cache of written blocks alone would grow by ~140 MB, and deleting
    the rows would hold ~300 MB more (or fail under the limit)."""
    policy = tmp_path / "wide.yaml"
    policy.write_text(WIDE)
    peaks = []
    for rows in (3_000_000, 9_000_000):
        data = tmp_path / f"wide_{rows}.parquet"
        duckdb.sql(f"COPY (SELECT hash(range) % 100 AS v, hash(range + 1) AS a, "
                   f"hash(range + 2) AS b FROM range({rows})) TO '{data}' (FORMAT parquet)")
        store = tmp_path / f"wide_{rows}.duckdb"
        out = subprocess.run([sys.executable, "-c", PEAK, sys.executable, "-m", "dpsql", "init",
                              str(store), "--policy", str(policy), "--import", f"wide={data}",
                              "--outside", "drop"], capture_output=True, text=True, check=True)
        peaks.append(int(out.stdout.split()[-1]) / 1024)
        with duckdb.connect(str(store), read_only=True) as con:
            assert con.execute("SELECT count(*) FILTER (WHERE v >= 50), count(*) "
                               "FROM wide").fetchone()[0] == 0
        data.unlink()
        store.unlink()
    assert peaks[1] - peaks[0] < 30, f"peak {peaks[0]:.0f} MB at 3M rows, {peaks[1]:.0f} at 9M"


@pytest.mark.slow
def test_init_refuses_millions_of_distinct_outside_values_within_its_limits(tmp_path):
    """The domain check's examples group every distinct value outside: 10M strings need
    DuckDB to spill, which the import's memory limit allows on one thread only."""
    data = tmp_path / "ids.parquet"
    duckdb.sql(f"COPY (SELECT md5(range::VARCHAR) || md5((range + 1)::VARCHAR) AS id "
               f"FROM range(10000000)) TO '{data}' (FORMAT parquet)")
    policy = tmp_path / "ids.yaml"
    policy.write_text(WIDE.replace("wide", "ids").replace(
        "      v: {type: integer, bounds: [0, 49]}\n      a: {type: hidden}\n      b: {type: "
        "hidden}\n", "      id: {type: categorical, values: ['a']}\n"))
    with pytest.raises(DomainError, match=r"ids\.id hold values outside"):
        dpsql.init(tmp_path / "ids.duckdb", policy, {"ids": data})
    assert not (tmp_path / "ids.duckdb").exists()


def test_the_owners_migrations_make_every_table_once_in_one_order(store_path):
    assert OWNERS[0] is store_tables.TABLES  # the schemas come first
    assert schema_version(OWNERS) == 8  # 1-7 written before the split; 8 the held schema
    owners = [owner.owner for owner in OWNERS]
    assert len(set(owners)) == len(owners)
    assert owners.index("ledger") < owners.index("jobs")  # jobs' recovery settles through it
    with open_store(store_path) as store:
        made = {r[0] for r in store.cursor().execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'dpsql'").fetchall()}
    created = [m.group(1) for owner in OWNERS for statements in owner.migrations.values()
               for s in statements for m in [re.match(r"CREATE TABLE dpsql\.(\w+)", s)] if m]
    assert sorted(created) == sorted(made)  # each table by one owner, once


def test_services_are_built_at_open_shared_by_handles_and_closed_in_order(store_path):
    assert not hasattr(Store, "state")
    first = open_store(store_path)
    second = open_store(store_path)
    keys = (JOBS, BOOKS, FREE, SANDBOXES)
    assert all(second[key] is first[key] for key in keys)
    assert isinstance(first[FREE], FreeDatabase)
    assert isinstance(first[BOOKS], Books)
    free = first[FREE]
    assert free._folder is None  # nothing made before it is used
    with free.using(first):
        pass
    folder = free._folder
    assert folder is not None
    second.close()
    assert folder.is_dir()  # one handle left: nothing closed
    closed: list[str] = []
    for key in keys:
        service = first[key]
        real = service.close

        def close(name: str = key.name, real: Callable[[], None] = real) -> None:
            closed.append(name)
            real()
        object.__setattr__(service, "close", close)
    first.close()
    assert closed == ["jobs", "books", "free", "sandboxes"]
    assert not folder.exists()


def test_a_service_key_is_typed_and_unknown_keys_fail_loudly(store_path):
    with open_store(store_path) as store:
        with pytest.raises(KeyError):
            store[StoreKey("nobody declared this")]
        assert repr(FREE) == "<StoreKey free>"


def test_the_open_settles_a_left_jobs_request_only_if_it_is_open(admin, store_path):
    ledger = admin.ledger
    settled_first = ledger.record("admin", "adult", "release x", Outcome.STARTED)
    ledger.settle(settled_first, Outcome.RELEASED)  # its process ended before the job row
    left_open = ledger.record("admin", "adult", "release y", Outcome.STARTED)
    with admin.store.transaction() as cur:  # two job rows a killed process left running
        for audit_id in (settled_first, left_open):
            cur.execute("INSERT INTO dpsql.jobs (id, user_name, kind, name, state, "
                        "submitted_at, audit_id) VALUES (nextval('dpsql.job_ids'), 'admin', "
                        "'release', 'x', 'running', now(), ?)", [audit_id])
    admin.close()
    with dpsql.connect(store_path, "admin") as again:
        outcomes = {r["id"]: r["outcome"] for r in again.audit()}
        assert outcomes[settled_first] is Outcome.RELEASED  # a settled row never changes
        assert outcomes[left_open] is Outcome.INTERRUPTED
        assert [j["state"] for j in again.jobs().list()] == [JobState.INTERRUPTED] * 2
