"""A small team on one served store: 20 analysts query over the wire while an admin
releases a table, grants budget and reads the audit log through the CLI.

Nothing may be refused for a lock, every charge must be exact in the ledger, and the
audit ids must be consecutive (issue 23's "done when"). The latency figures are the
benchmark's (benchmarks/release_latency.py); this test only checks correctness.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

import dpsql
from dpsql import passwords

from ..conftest import ADULT_SAMPLE
from ..waits import until
from .conftest import _env, serve_args, start_server

ANALYSTS = [f"a{i:02d}" for i in range(20)]
POLICY = """version: 1
accounting: zcdp
delta: 0.000001
datasets:
  adult:
    table: adult
    budget: {epsilon: 1000}
    query_cap: {epsilon: 1}
    default_query: {epsilon: 0.01}
    synthesizers: [aim, independent]
    columns:
      age: {type: integer, bounds: [0, 84], bins: 6}
      sex: {type: categorical, values: [0, 1]}
      race: {type: categorical, values: [0, 1, 2, 3, 4]}
      education_num: {type: integer, bounds: [0, 15], bins: 4}
      income_50k: {type: categorical, values: [0, 1]}
      fnlwgt: {type: hidden}
users:
  admin: {role: admin, budgets: {adult: {epsilon: 50}}}
""" + "".join(f"  {a}: {{role: analyst, budgets: {{adult: {{epsilon: 20}}}}}}\n"
              for a in ANALYSTS)


def _store(tmp_path: Path) -> Path:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    db = tmp_path / "team.duckdb"
    store, _ = dpsql.init(db, policy, {"adult": ADULT_SAMPLE})
    try:
        for user in ANALYSTS:
            passwords.set_password(store, user, f"{user}-secret-1")
    finally:
        store.close()
    return db


def _dpsql(db: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dpsql", *args, "--db", str(db)],
                          capture_output=True, text=True, env=_env(), timeout=timeout)


class Analyst(threading.Thread):
    """Asks fresh DP queries (never a cached repeat) until told to stop."""

    def __init__(self, dsn: str, user: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.dsn, self.user, self.stop = dsn, user, stop
        self.answers = 0
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as con:
                n = 0
                while not self.stop.is_set():
                    n += 1
                    query = (f"SELECT sex, COUNT(*) FROM adult WHERE age >= {n % 80} "
                             f"AND education_num <= {15 - n % 7} GROUP BY sex")
                    try:
                        con.execute(query).fetchall()
                        self.answers += 1
                    except psycopg.Error as err:
                        self.errors.append(f"{type(err).__name__}: {err}")
        except Exception as err:  # a connection failure is a finding too
            self.errors.append(f"{type(err).__name__}: {err}")


@pytest.mark.slow
def test_twenty_analysts_query_while_an_admin_releases_grants_and_reads_the_audit(
        tmp_path: Path) -> None:
    db = _store(tmp_path)
    stop = threading.Event()
    with start_server(serve_args(db, "--workers", "8", "--max-clients", "64")) as server:
        analysts = [Analyst(server.dsn(a, f"{a}-secret-1"), a, stop) for a in ANALYSTS]
        for analyst in analysts:
            analyst.start()
        until(lambda: all(a.answers or a.errors for a in analysts), "an analyst never answered")
        release = subprocess.Popen(
            [sys.executable, "-m", "dpsql", "release", "adult", "--synth", "aim",
             "--name", "team_aim", "--epsilon", "1", "--seed", "5", "--db", str(db)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        until(lambda: json.loads(_dpsql(db, "jobs", "--json").stdout or "[]"),
               "the release never became a job")  # charged: it runs (or has run) now
        submitted = sum(a.answers for a in analysts)
        grant = _dpsql(db, "budget", "grant", "a00", "adult", "--epsilon", "1")
        audit = _dpsql(db, "audit", "--last", "20", "--json")
        _, err = release.communicate(timeout=900)
        released = sum(a.answers for a in analysts)
        until(lambda: sum(a.answers for a in analysts) > released or any(
            a.errors for a in analysts), "the analysts were not served after the release")
        stop.set()
        for analyst in analysts:
            analyst.join(timeout=60)
        assert server.alive()
        assert release.returncode == 0, err
        assert released > submitted, "no analyst was answered while the release ran"

    assert grant.returncode == 0, grant.stderr
    assert audit.returncode == 0, audit.stderr
    assert len(json.loads(audit.stdout)) == 20
    for analyst in analysts:
        assert analyst.errors == [], (analyst.user, analyst.errors[:3])
        assert analyst.answers >= 5, (analyst.user, analyst.answers)

    with dpsql.connect(db, "admin") as admin:
        cur = admin.store.cursor()
        ids = [r[0] for r in cur.execute("SELECT id FROM dpsql.audit ORDER BY id").fetchall()]
        assert ids == list(range(ids[0], ids[0] + len(ids))), "audit ids have gaps"
        charged = dict(cur.execute(
            "SELECT user_name, count(*) FROM dpsql.charges GROUP BY user_name").fetchall())
        answered = dict(cur.execute(
            "SELECT user_name, count(*) FROM dpsql.audit WHERE outcome = 'answered' "
            "GROUP BY user_name").fetchall())
        for analyst in analysts:  # one charge per fresh answer, none for anything else
            assert charged.get(analyst.user) == analyst.answers, analyst.user
            assert answered.get(analyst.user) == analyst.answers, analyst.user
        units = cur.execute("SELECT DISTINCT units FROM dpsql.charges "
                            "WHERE user_name <> 'admin'").fetchall()
        assert len(units) == 1, units  # every analyst query costs the default
        for analyst in analysts:  # the ledger's standing is the sum of its charge rows
            spent = admin.budget(analyst.user)[0].spent
            assert spent.units == analyst.answers * units[0][0], analyst.user
        assert cur.execute("SELECT count(*) FROM released.team_aim").fetchone()[0] > 0


@pytest.mark.slow
def test_kill_9_of_the_server_mid_release_loses_no_charge_and_leaves_no_table(
        tmp_path: Path) -> None:
    from ..release.test_jobs import gone

    db = _store(tmp_path)
    with start_server(serve_args(db)) as server:
        detached = _dpsql(db, "release", "adult", "--synth", "aim", "--name", "killed",
                          "--epsilon", "1", "--seed", "5", "--detach")
        assert detached.returncode == 0, detached.stderr
        deadline = time.monotonic() + 300
        while True:  # through the server: the job is fitting in its worker
            listed = _dpsql(db, "jobs", "--json")
            assert listed.returncode == 0, listed.stderr
            [job] = json.loads(listed.stdout)
            if job["state"] == "running" and job["stage"] in ("fit", "round"):
                break
            assert job["state"] in ("queued", "running"), job
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        server.process.kill()
        server.process.wait(30)
    with dpsql.connect(db, "admin") as admin:
        [row] = admin.jobs().list()
        assert row["state"] == "interrupted"
        assert gone(row["worker_pid"]), "the worker outlived the server"
        cur = admin.store.cursor()
        assert cur.execute("SELECT count(*) FROM duckdb_tables() "
                           "WHERE schema_name = 'released'").fetchone()[0] == 0
        assert admin.budget("admin")[0].spent == admin.cost(epsilon=1)  # the charge stays
        [outcome] = cur.execute("SELECT outcome FROM dpsql.audit WHERE id = ?",
                                [row["audit_id"]]).fetchone()
        assert outcome == "interrupted"
        [folder] = cur.execute("SELECT folder FROM dpsql.jobs").fetchone()
        assert folder
        assert not Path(folder).exists()  # no bounded rows left on disk
