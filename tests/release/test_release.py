"""Releases: the whole flow, its provenance, and bad input that costs nothing."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql import provenance
from dpsql.errors import (
    AccessDenied,
    BudgetExceeded,
    ConfigurationError,
    InternalError,
    ReleaseError,
)
from dpsql.imports import table_columns
from dpsql.jobs import Jobs
from dpsql.provenance import export, read_parquet_record

from .conftest import release_policy

COLUMNS = ["age", "sex", "race", "income_50k"]


def spent(session, user="admin"):
    return session.ledger.budget(user, "adult").spent


def released_tables(session):
    rows = session.store.cursor().execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'released'"
    ).fetchall()
    return sorted(r[0] for r in rows)


def provenance_rows(session):
    return session.store.cursor().execute("SELECT count(*) FROM dpsql.releases").fetchone()[0]


def _keys(value):
    if isinstance(value, dict):
        return set(value) | set().union(*(_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_keys(v) for v in value))
    return set()


def last_audit(session):
    return session.audit(last=1)[0]


# -- the happy path -----------------------------------------------------------------------------


def test_release_writes_table_provenance_and_charges_once(admin_session):
    before = spent(admin_session)
    result = admin_session.release("adult", synthesizer="joint", epsilon=1, columns=COLUMNS,
                                   name="adult_joint", seed=42)
    cost = admin_session.cost(epsilon=1)
    assert spent(admin_session) == before + cost
    assert released_tables(admin_session) == ["adult_joint"]
    cur = admin_session.store.cursor()
    data = cur.sql("SELECT * FROM released.adult_joint").to_arrow_table()
    assert data.column_names == COLUMNS
    assert data.num_rows == result.record["rows"]
    assert abs(data.num_rows - 5000) < 500  # the DP row estimate
    assert set(data.column("sex").to_pylist()) <= {0, 1}
    ages = data.column("age").to_pylist()
    assert min(ages) >= 0
    assert max(ages) <= 84
    audit = last_audit(admin_session)
    assert (audit["action"], audit["outcome"]) == ("release", "released")
    assert audit["cost"] == cost


def test_provenance_record_table_and_comment_agree(admin_session):
    result = admin_session.release("adult", synthesizer="independent", epsilon=0.5,
                                   name="ind", seed=7)
    record = result.record
    stored = provenance.find(admin_session.store, "ind")
    assert stored["record"] == record
    assert stored["privacy"] == "dp"
    assert stored["synthesizer"] == "independent"
    policy = admin_session.policy
    assert record["policy_fingerprint"] == policy.fingerprint
    assert record["dataset"]["name"] == "adult"
    assert record["dataset"]["privacy_unit"] == "row"
    assert len(record["dataset"]["fingerprint"]) == 16
    assert record["seed"] == {"value": 7, "source": "user"}
    charged = record["cost"]["charged"]
    assert charged["kind"] == "zcdp"
    assert charged["epsilon"] == pytest.approx(0.5, rel=1e-9)
    assert float(record["cost"]["spent"]["rho"]) <= float(charged["rho"])
    assert [m["columns"] for m in record["measurements"]] == [[c] for c in
                                                              record["columns"]] + [[]]
    assert record["rows"] == record["total_rows"]
    assert record["copies"] == 1
    assert record["resumable"] is True
    assert not _keys(record) & {"noisy", "counts", "tables"}  # descriptors only, no counts
    comment = admin_session.store.cursor().execute(
        "SELECT comment FROM duckdb_tables() WHERE schema_name = 'released' "
        "AND table_name = 'ind'").fetchone()[0]
    summary, body = comment.split("\n", 1)
    assert summary.startswith(f"dpsql release {result.release_id} of adult by independent (dp")
    assert json.loads(body) == record


def test_copies_add_a_copy_column(admin_session):
    admin_session.release("adult", synthesizer="independent", epsilon=1, columns=["sex"],
                          rows=100, copies=3, name="three")
    counts = admin_session.store.cursor().execute(
        "SELECT _copy, count(*) FROM released.three GROUP BY 1 ORDER BY 1").fetchall()
    assert counts == [(1, 100), (2, 100), (3, 100)]


def test_pure_accounting_release(make_store):
    with dpsql.connect(make_store(release_policy("pure")), "admin") as admin:
        result = admin.release("adult", synthesizer="independent", epsilon=1, name="pure_ind")
        assert result.record["cost"]["charged"] == {"kind": "pure", "epsilon": "1"}
        mechanisms = {m["mechanism"] for m in result.record["measurements"]}
        assert mechanisms == {"discrete_laplace"}


def test_replace_keeps_the_old_provenance_superseded(admin_session):
    first = admin_session.release("adult", synthesizer="with_products", epsilon=0.5,
                                  columns=["sex"], name="t")
    assert released_tables(admin_session) == ["t", "t_aggregates"]
    with pytest.raises(ReleaseError, match="already exists"):
        admin_session.release("adult", synthesizer="independent", epsilon=0.5, name="t")
    second = admin_session.release("adult", synthesizer="independent", epsilon=0.5,
                                   columns=["race"], name="t", replace=True)
    assert released_tables(admin_session) == ["t"]  # the old product went with it
    rows = provenance.releases(admin_session.store, include_superseded=True)
    assert [(r["release_id"], r["superseded_by"]) for r in rows] == [
        (first.release_id, second.release_id), (second.release_id, None)]
    assert table_columns(admin_session.store, "t", "released") == {"race": "BIGINT"}


def test_a_product_never_takes_another_releases_table(admin_session):
    kept = admin_session.release("adult", synthesizer="independent", epsilon=0.5,
                                 columns=["sex"], name="x_aggregates")
    before = spent(admin_session)
    for replace in (False, True):  # --replace replaces x only, never x_aggregates
        with pytest.raises(ReleaseError, match=r"also writes released\.x_aggregates, which "
                                               "another release holds"):
            admin_session.release("adult", synthesizer="with_products", epsilon=0.5,
                                  columns=["race"], name="x", replace=replace)
    assert spent(admin_session) == before  # refused before the charge
    assert released_tables(admin_session) == ["x_aggregates"]
    assert table_columns(admin_session.store, "x_aggregates", "released") == {"sex": "BIGINT"}
    assert provenance.current(admin_session.store, "x_aggregates")["release_id"] == \
        kept.release_id


def test_a_product_taken_after_the_plan_is_not_overwritten(admin_session, monkeypatch):
    # Another release takes the product's name while this one fits (in its worker process,
    # which the owner waits for here): nothing is written.
    real_fit = Jobs._in_worker

    def fit_then_race(self, *args, **kwargs):
        real_fit(self, *args, **kwargs)
        with admin_session.store.transaction() as cur:
            cur.execute("CREATE TABLE released.y_aggregates AS SELECT 1 AS other")

    monkeypatch.setattr(Jobs, "_in_worker", fit_then_race)
    with pytest.raises(ReleaseError, match="belongs to another release; nothing was written"):
        admin_session.release("adult", synthesizer="with_products", epsilon=0.5,
                              columns=["race"], name="y")
    assert released_tables(admin_session) == ["y_aggregates"]
    assert provenance.current(admin_session.store, "y") is None


def test_products_share_the_provenance(admin_session):
    result = admin_session.release("adult", synthesizer="with_products", epsilon=0.5,
                                   columns=["race"], name="p")
    assert result.record["products"] == ["released.p_aggregates"]
    rows = admin_session.store.cursor().execute(
        "SELECT count(*) FROM released.p_aggregates").fetchone()[0]
    assert rows == 5
    comment = admin_session.store.cursor().execute(
        "SELECT comment FROM duckdb_tables() WHERE table_name = 'p_aggregates'").fetchone()[0]
    assert json.loads(comment.split("\n", 1)[1])["release_id"] == result.release_id


def test_non_dp_release_is_labelled_and_free_but_audited(make_store):
    with dpsql.connect(make_store(release_policy(allow_non_dp=True)), "admin") as admin:
        before = spent(admin)
        result = admin.release("adult", synthesizer="not_dp", name="raw_ish", columns=["sex"])
        assert spent(admin) == before
        assert result.record["privacy"] == "empirical"
        audit = last_audit(admin)
        assert (audit["action"], audit["outcome"]) == ("release", "released")
        assert audit["cost"].is_zero


# -- refusals that cost nothing -----------------------------------------------------------------


BAD_INPUT = [
    pytest.param(dict(synthesizer="jiont"), ConfigurationError, "did you mean 'joint'",
                 id="unknown-synthesizer"),
    pytest.param(dict(synthesizer="not_dp"), ReleaseError, "allow_non_dp", id="non-dp"),
    pytest.param(dict(columns=["fnlwgt"]), ConfigurationError, "hidden", id="hidden-column"),
    pytest.param(dict(columns=["agee"]), ConfigurationError, "did you mean 'age'",
                 id="unknown-column"),
    pytest.param(dict(columns=["age", "sex", "age"]), ConfigurationError, "more than once",
                 id="repeated-column"),
    pytest.param(dict(rows=0), ConfigurationError, "rows must be a positive", id="rows-zero"),
    pytest.param(dict(rows=-5), ConfigurationError, "rows must be a positive",
                 id="rows-negative"),
    pytest.param(dict(copies=0), ConfigurationError, "copies", id="copies-zero"),
    pytest.param(dict(name="1bad"), ConfigurationError, "not a valid identifier",
                 id="bad-name"),
    pytest.param(dict(name="x; DROP TABLE adult"), ConfigurationError, "not a valid identifier",
                 id="injection-name"),
    pytest.param(dict(epsilon=-1), ConfigurationError, "epsilon", id="negative-epsilon"),
    pytest.param(dict(epsilon=50), BudgetExceeded, "left", id="over-budget"),
    pytest.param(dict(synthesizer="lowering", passthrough="0.5"), ReleaseError,
                 "allow_options", id="privacy-lowering-option"),
    pytest.param(dict(synthesizer="joint", columns=COLUMNS, max_cells="10"), ReleaseError,
                 r"max_cells.*coarser bins in the policy, or use the independent synthesizer$",
                 id="joint-too-large"),  # no larger budget: the cells do not depend on it
    pytest.param(dict(synthesizer="range", columns=["sex"]), ConfigurationError, "numeric",
                 id="range-categorical"),
    pytest.param(dict(synthesizer="range", columns=["age"], copies=2), ConfigurationError,
                 "drop --rows and --copies", id="range-copies"),
    pytest.param(dict(max_cell="3", synthesizer="joint"), ConfigurationError,
                 "did you mean 'max_cells'", id="unknown-option"),
]


@pytest.mark.parametrize(("change", "error", "message"), BAD_INPUT)
def test_bad_input_is_refused_without_charge_or_trace(admin_session, change, error, message):
    args = {"synthesizer": "independent", "epsilon": 1, "name": "out", **change}
    before = spent(admin_session)
    with pytest.raises(error, match=message):
        admin_session.release("adult", **args)
    assert spent(admin_session) == before
    assert released_tables(admin_session) == []
    assert provenance_rows(admin_session) == 0
    assert last_audit(admin_session)["outcome"] == "refused"


def test_synthesizer_not_allowed_by_policy(make_store):
    with dpsql.connect(make_store(release_policy(synthesizers="independent")), "admin") as admin:
        with pytest.raises(ReleaseError, match="does not allow synthesizer 'joint'"):
            admin.release("adult", synthesizer="joint", epsilon=1, name="x")
        assert spent(admin).is_zero


def test_privacy_lowering_option_allowed_by_policy(make_store):
    path = make_store(release_policy(allow_options="[passthrough]"))
    with dpsql.connect(path, "admin") as admin:
        result = admin.release("adult", synthesizer="lowering", epsilon=1, name="x",
                               passthrough="0.5")
        assert result.record["synthesizer"]["options"] == {"passthrough": "0.5"}
        # The default value needs no permission anywhere.
    with dpsql.connect(make_store(release_policy()), "admin") as admin:
        admin.release("adult", synthesizer="lowering", epsilon=1, name="y", passthrough="0")


def test_analysts_cannot_release(release_store):
    with dpsql.connect(release_store, "alice") as alice:
        with pytest.raises(AccessDenied, match="analyst"):
            alice.release("adult", synthesizer="independent", epsilon=1, name="mine")
        assert spent(alice, "alice").is_zero
        assert released_tables(alice) == []


# -- failures after the charge -------------------------------------------------------------------


def test_crash_while_sampling_keeps_the_charge_and_writes_nothing(admin_session):
    before = spent(admin_session)
    with pytest.raises(ReleaseError, match="nothing was written"):
        admin_session.release("adult", synthesizer="crash_sample", epsilon=1, name="boom")
    assert spent(admin_session) == before + admin_session.cost(epsilon=1)
    assert released_tables(admin_session) == []
    assert provenance_rows(admin_session) == 0
    audit = last_audit(admin_session)
    assert audit["outcome"] == "failed"
    assert "RuntimeError" in audit["reason"]


def test_crash_inside_the_write_transaction_rolls_everything_back(admin_session):
    before = spent(admin_session)
    with pytest.raises(ReleaseError):
        admin_session.release("adult", synthesizer="crash_write", epsilon=1, name="boom")
    assert spent(admin_session) == before + admin_session.cost(epsilon=1)
    assert released_tables(admin_session) == []  # neither boom nor boom_first
    assert provenance_rows(admin_session) == 0
    count = admin_session.store.cursor().execute(
        "SELECT count(*) FROM dpsql.release_states").fetchone()[0]
    assert count == 0


def test_a_synthesizer_that_overspends_is_a_bug_and_writes_nothing(admin_session):
    with pytest.raises(InternalError, match="bug in the synthesizer"):
        admin_session.release("adult", synthesizer="overspend", epsilon=1, name="greedy")
    assert released_tables(admin_session) == []


# -- more copies, export ---------------------------------------------------------------------------


@pytest.mark.parametrize("synthesizer", ["independent", "joint"])
def test_release_more_appends_copies_for_free(admin_session, synthesizer):
    admin_session.release("adult", synthesizer=synthesizer, epsilon=1, columns=COLUMNS,
                          rows=200, name="m")
    before = spent(admin_session)
    result = admin_session.release_more("m", 2, seed=3)
    assert spent(admin_session) == before
    counts = admin_session.store.cursor().execute(
        "SELECT _copy, count(*) FROM released.m GROUP BY 1 ORDER BY 1").fetchall()
    assert counts == [(1, 200), (2, 200), (3, 200)]
    record = provenance.find(admin_session.store, "m")["record"]
    assert record == result.record
    assert record["copies"] == 3
    assert record["total_rows"] == 600
    assert record["extensions"][0]["copies"] == [2, 3]
    assert record["extensions"][0]["seed"] == {"value": 3, "source": "user"}
    admin_session.release_more("m", 1)
    assert provenance.find(admin_session.store, "m")["record"]["copies"] == 4


def test_release_more_needs_a_stored_state(admin_session):
    admin_session.release("adult", synthesizer="range", epsilon=1, columns=["age"], name="r")
    with pytest.raises(ReleaseError, match="kept no state"):
        admin_session.release_more("r", 2)
    with pytest.raises(ReleaseError, match="did you mean 'r'"):
        admin_session.release_more("rr", 2)


def test_export_carries_the_provenance(admin_session, release_store, tmp_path):
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    result = admin_session.release("adult", synthesizer="independent", epsilon=1, copies=2,
                                   rows=50, name="e")
    with dpsql.connect(release_store, "alice") as alice:  # released tables are free to read
        info = export(alice.store, "e", tmp_path / "e.parquet")
    assert info["rows"] == 100
    assert pq.read_table(tmp_path / "e.parquet").num_rows == 100
    assert read_parquet_record(tmp_path / "e.parquet") == result.record
    with pytest.raises(ConfigurationError, match=r"\.parquet"):
        export(admin_session.store, "e", tmp_path / "e.csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.parquet"]


def test_progress_is_reported_by_stage(admin_session):
    seen = []
    admin_session.release("adult", synthesizer="independent", epsilon=1, copies=3, rows=10,
                          name="p", progress=lambda stage, done, total=None: seen.append(
                              (stage, done, total)))
    stages = [s for s, _, _ in seen]
    assert stages.index("fit") < stages.index("measure") < stages.index("sample") \
        < stages.index("write")
    assert ("sample", 3, 3) in seen
    assert ("write", 1, 1) in seen
