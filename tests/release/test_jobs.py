"""Releases as jobs: lifecycle, cancel, kill -9 of the owner, same results as in-process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import dpsql
from dpsql.engines.interrupt import Interrupter
from dpsql.engines.source import bounded_relation
from dpsql.errors import AccessDenied, BudgetExceeded, QueryCanceled, ReleaseError
from dpsql.policies import release_domain
from dpsql.privacy import PrivacyCost
from dpsql.progress import silent
from dpsql.release import ReleaseRequest
from dpsql.release.fit import FitSpec, fit_and_sample
from dpsql.synth import base

from .conftest import release_policy
from .test_release import last_audit, provenance_rows, released_tables, spent


def job_row(session, job_id):
    return next(j for j in session.jobs().list() if j["id"] == job_id)


def exported_folder(session, job_id) -> Path:
    folder = session.store.cursor().execute("SELECT folder FROM dpsql.jobs WHERE id = ?",
                                            [job_id]).fetchone()[0]
    assert folder.startswith(tempfile.gettempdir())
    return Path(folder)


def gone(pid: int, within: float = 60.0) -> bool:
    """Whether process ``pid`` ends (a zombie counts as ended).

    ``within`` seconds only guard against a hang: the processes tested would otherwise
    run for several times as long (a slow fit, an idle worker).
    """
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def until(condition, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_job_is_queued_run_and_recorded(admin_session):
    seen = []
    job = admin_session.submit(ReleaseRequest("adult", "independent", "j", epsilon=1,
                                              columns=["sex", "race"], rows=10))
    assert job_row(admin_session, job)["state"] in ("queued", "running")
    result = admin_session.jobs().wait(job, lambda *event: seen.append(event))
    assert result.table == "released.j"
    assert ("write", 1, 1) in seen
    assert seen[0][0] == "fit"
    row = job_row(admin_session, job)
    assert (row["state"], row["kind"], row["name"], row["dataset"], row["synthesizer"],
            row["user"], row["error"]) == ("succeeded", "release", "j", "adult", "independent",
                                           "admin", None)
    assert row["stage"] == "write"
    assert row["finished_at"] >= row["submitted_at"]
    assert row["audit_id"] == result.record["audit_id"]
    assert last_audit(admin_session)["outcome"] == "released"
    assert gone(row["worker_pid"])
    assert not exported_folder(admin_session, job).exists()


def test_a_refused_request_raises_at_submit_and_leaves_no_job(admin_session):
    before = spent(admin_session)
    with pytest.raises(BudgetExceeded):
        admin_session.submit(ReleaseRequest("adult", "independent", "x", epsilon=50))
    assert spent(admin_session) == before
    assert admin_session.jobs().list() == []


def test_cancel_mid_fit_keeps_the_charge_and_writes_nothing(admin_session):
    before = spent(admin_session)
    job = admin_session.submit(ReleaseRequest("adult", "slow", "never", epsilon=1,
                                              options={"seconds": 600}))
    until(lambda: job_row(admin_session, job)["stage"] == "wait")
    pid = job_row(admin_session, job)["worker_pid"]
    admin_session.jobs().cancel(job, "admin")
    assert gone(pid)  # the cancel ended it: its fit would last 10 minutes
    with pytest.raises(ReleaseError, match=r"was cancelled by admin; the charge of .* stays"):
        admin_session.jobs().wait(job)
    assert spent(admin_session) == before + admin_session.cost(epsilon=1)
    assert released_tables(admin_session) == []
    assert provenance_rows(admin_session) == 0
    assert last_audit(admin_session)["outcome"] == "cancelled"
    assert job_row(admin_session, job)["state"] == "cancelled"
    with pytest.raises(ReleaseError, match="not queued or running"):
        admin_session.jobs().cancel(job, "admin")


def test_ctrl_c_while_waiting_cancels_the_job(admin_session):
    def interrupt(stage, done, total=None):
        if stage == "wait":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        admin_session.release("adult", synthesizer="slow", epsilon=1, name="cut",
                              seconds=120, progress=interrupt)
    assert [j["state"] for j in admin_session.jobs().list()] == ["cancelled"]
    assert released_tables(admin_session) == []
    assert last_audit(admin_session)["reason"].startswith("cancelled by admin; the charge of")


def test_show_jobs_is_for_administrators(release_store, admin_session):
    admin_session.release("adult", synthesizer="independent", epsilon=1, name="s",
                          columns=["sex"], rows=5)
    shown = admin_session.sql("SHOW dpsql.jobs").table
    assert shown.column("name").to_pylist() == ["s"]
    assert shown.column("state").to_pylist() == ["succeeded"]
    with dpsql.connect(release_store, "alice") as analyst, pytest.raises(AccessDenied):
        analyst.sql("SHOW dpsql.jobs")


@pytest.mark.parametrize("synthesizer", ["not_dp", "not_dp_joint"])
def test_a_job_releases_what_an_in_process_fit_gives(make_store, synthesizer):
    # The worker reads the exported source; fitting on the store's own bounded relation in
    # this process with the same seed must give the same table. DP noise is never seeded,
    # so these test twins of independent and joint measure exactly; the seed fixes the rest.
    path = make_store(release_policy(allow_non_dp=True))
    with dpsql.connect(path, "admin") as session:
        result = session.release("adult", synthesizer=synthesizer,
                                 columns=["age", "sex", "income_50k"], copies=2, seed=11,
                                 name="w")
        store, record = session.store, result.record
        spec = FitSpec(base.get(synthesizer), synthesizer, release_domain(store, record),
                       PrivacyCost.zero("zcdp"), 11, None, 2)
        here = fit_and_sample(bounded_relation(store, session.policy.dataset("adult")), spec,
                              silent)
        written = store.cursor().sql("SELECT * FROM released.w").to_arrow_table()
    assert written.num_rows == 2 * record["rows"] == here.table.num_rows
    assert written.equals(here.table)
    assert here.description["measurements"] == record["measurements"]


KILLED_OWNER = """
import sys
import tempfile
from tests.release.conftest import register_test_synthesizers
import dpsql
register_test_synthesizers()
session = dpsql.connect(sys.argv[1], "admin")
def report(stage, done, total=None):
    if stage == "wait":
        print("fitting", flush=True)
session.release("adult", synthesizer="slow", epsilon=1, name="killed", seconds=300,
                progress=report)
"""


def test_kill_9_of_the_owner_mid_fit_loses_no_charge_and_leaves_no_table(release_store):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path])}
    with subprocess.Popen([sys.executable, "-c", KILLED_OWNER, str(release_store)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          cwd=root) as owner:
        try:
            line = owner.stdout.readline()
            assert line == "fitting\n", owner.stderr.read()
        finally:
            owner.send_signal(signal.SIGKILL)
            owner.wait(30)
    with dpsql.connect(release_store, "admin") as session:
        [job] = session.jobs().list()
        assert (job["state"], job["name"]) == ("interrupted", "killed")
        assert gone(job["worker_pid"]), "the worker outlived its owner"
        assert not exported_folder(session, job["id"]).exists()  # no bounded rows left
        assert spent(session) == session.cost(epsilon=1)  # the charge stays
        assert released_tables(session) == []
        assert provenance_rows(session) == 0
        audit = [a for a in session.audit() if a["id"] == job["audit_id"]]
        assert [a["outcome"] for a in audit] == ["interrupted"]


def test_closing_the_store_waits_for_a_detached_job(release_store):
    with dpsql.connect(release_store, "admin") as session:
        job = session.submit(ReleaseRequest("adult", "slow", "later", epsilon=1, rows=5,
                                            columns=["sex"], options={"seconds": 0.5}))
    with dpsql.connect(release_store, "admin") as session:
        assert job_row(session, job)["state"] == "succeeded"
        assert released_tables(session) == ["later"]


def test_jobs_of_one_store_run_one_at_a_time(admin_session):
    first = admin_session.submit(ReleaseRequest("adult", "slow", "a", epsilon=1, rows=5,
                                                columns=["sex"], options={"seconds": 120}))
    until(lambda: job_row(admin_session, first)["stage"] == "wait")
    second = admin_session.submit(ReleaseRequest("adult", "independent", "b", epsilon=1,
                                                 rows=5, columns=["sex"]))
    assert job_row(admin_session, second)["state"] == "queued"
    waiter = threading.Thread(target=admin_session.jobs().wait, args=(second,))
    waiter.start()
    admin_session.jobs().cancel(first, "admin")
    waiter.join(60)
    assert [j["state"] for j in admin_session.jobs().list()] == ["succeeded", "cancelled"]


def test_the_exported_source_holds_only_the_release_columns(admin_session, tmp_path):
    """The worker's copy of the real rows: the domain's columns, not hidden or unlisted ones."""
    import pyarrow as pa

    from dpsql.release import prepare
    from dpsql.release.fit import SOURCE_FILE

    ctx = admin_session.context()
    charged = prepare(ctx, ReleaseRequest("adult", "independent", "exported", epsilon=0.5,
                                          columns=["sex", "age"]))
    charged.export(ctx, tmp_path, Interrupter())
    with pa.memory_map(str(tmp_path / SOURCE_FILE)) as source:
        names = pa.ipc.open_file(source).schema.names
    assert names == ["sex", "age", "rows"]  # not fnlwgt (hidden), nor the table's other columns


def test_the_exported_counts_expand_to_the_bounded_rows(admin_session, tmp_path):
    """The contingency table the engine exports stands for exactly the bounded source's rows.

    Fewer rows cross than the source holds, and the worker's expanded relation
    has the same multiset of rows as the bounded source itself.
    """
    import duckdb

    from dpsql.release import prepare
    from dpsql.release.fit import SOURCE_FILE, expanded, read_arrow

    ctx = admin_session.context()
    charged = prepare(ctx, ReleaseRequest("adult", "independent", "counted", epsilon=0.5,
                                          columns=["sex", "age", "race"]))
    charged.export(ctx, tmp_path, Interrupter())
    counts = read_arrow(tmp_path / SOURCE_FILE)
    source = bounded_relation(admin_session.store, admin_session.policy.dataset("adult"))
    grouped = "SELECT sex, age, race, count(*) FROM {} GROUP BY ALL ORDER BY ALL"
    want = source.query("s", grouped.format("s")).fetchall()
    assert counts.num_rows == len(want) < sum(n for *_, n in want)
    assert expanded(duckdb.connect(), counts).query(
        "e", grouped.format("e")).fetchall() == want


def test_expansion_repeats_each_row_its_count_null_included():
    import duckdb
    import pyarrow as pa

    from dpsql.release.fit import expanded, weight_column

    assert weight_column(["a", "rows", "_rows"]) == "__rows"  # never a domain column
    counts = pa.table({"rows": ["x", None, "x"], "_rows": pa.array([2, 3, 1], pa.int64())})
    assert Counter(expanded(duckdb.connect(), counts).fetchall()) == {(None,): 3, ("x",): 3}


def test_expansion_order_does_not_depend_on_the_order_groups_arrive_in():
    """A seeded fit sees the same rows in the same order whatever order the engine's
    GROUP BY handed the groups back in (it differs between runs and engines)."""
    import duckdb
    import pyarrow as pa

    from dpsql.release.fit import expanded

    counts = pa.table({"a": [3, 1, None, 2], "b": ["x", "y", "z", None],
                       "rows": pa.array([2, 1, 3, 2], pa.int64())})
    orders = [expanded(duckdb.connect(), counts.take(p)).fetchall()
              for p in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1])]
    assert orders[0] == orders[1] == orders[2]
    assert len(orders[0]) == 8


def test_an_interrupt_stops_the_export_on_the_store(admin_session, tmp_path):
    """What a cancel does while a job exports its source: the store's query stops."""
    from dpsql.release import prepare

    ctx = admin_session.context()
    charged = prepare(ctx, ReleaseRequest("adult", "independent", "stopped", epsilon=0.5,
                                          columns=["sex", "age"]))
    interrupts = Interrupter()
    with interrupts.statement():
        interrupts.interrupt()
        with pytest.raises(QueryCanceled):
            charged.export(ctx, tmp_path, interrupts)
    charged.export(ctx, tmp_path, Interrupter())  # the next statement runs
