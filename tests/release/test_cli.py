"""The release commands as a user runs them: a real process, --json, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest


def run(*args, db, user=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "DPSQL_DB": str(db)}
    if user:
        env["DPSQL_USER"] = user
    return subprocess.run([sys.executable, "-m", "dpsql", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def _release(db, *extra):
    made = run("release", "adult", "--synth", "joint", "--epsilon", "1", "--columns",
               "age,sex,income_50k", "--name", "adult_joint", "--copies", "2", "--seed", "5",
               "--option", "postprocess=clip", "--json", *extra, db=db)
    assert made.returncode == 0, made.stderr
    return json.loads(made.stdout)


def test_release_show_export(store_path, tmp_path):
    out = _release(store_path)
    assert out["table"] == "released.adult_joint"
    assert out["record"]["synthesizer"]["options"] == {"postprocess": "clip"}
    assert out["record"]["copies"] == 2
    assert out["warnings"] == []
    shown = run("releases", "show", "adult_joint", "--json", db=store_path, user="alice")
    assert shown.returncode == 0, shown.stderr  # provenance is public: analysts may read it
    assert json.loads(shown.stdout)["record"] == out["record"]
    target = tmp_path / "joint.parquet"
    exported = run("export", "adult_joint", str(target), db=store_path, user="alice")
    assert exported.returncode == 0, exported.stderr
    metadata = pq.read_schema(target).metadata
    assert json.loads(metadata[b"dpsql.provenance"]) == out["record"]


def test_release_errors_exit_with_their_class(store_path):
    unknown = run("release", "adult", "--synth", "indepedent", "--epsilon", "1", "--name", "x",
                  db=store_path)
    assert unknown.returncode == 8
    assert "did you mean 'independent'" in unknown.stderr
    over = run("release", "adult", "--synth", "independent", "--epsilon", "9", "--name", "x",
               "--json", db=store_path)
    assert over.returncode == 5
    assert json.loads(over.stdout)["error"] == "budget_exceeded"
    assert run("releases", "show", "nope", db=store_path).returncode == 7


@pytest.mark.slow
def test_the_whole_release_tour(store_path, tmp_path):
    _release(store_path)
    assert _release(store_path, "--replace")["record"]["copies"] == 2
    again = run("release", "adult", "--synth", "independent", "--epsilon", "0.1", "--name",
                "adult_joint", "--json", db=store_path)
    assert again.returncode == 7
    assert json.loads(again.stdout)["error"] == "release_error"
    listed = run("releases", "list", "--all", db=store_path)
    assert listed.stdout.count("adult_joint") == 2  # the superseded one too
    shown = run("releases", "show", "adult_joint", db=store_path)
    assert "measurements" in shown.stdout
    assert "discrete_gaussian" in shown.stdout
    more = run("release-more", "adult_joint", "--copies", "1", db=store_path)
    assert more.returncode == 0, more.stderr
    assert "no budget spent" in more.stdout
    report = tmp_path / "report"
    evaluated = run("evaluate", "adult_joint", "--out", str(report), db=store_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "NOT DP" in evaluated.stdout
    assert "bootstrap ideal" in evaluated.stdout
    assert (report / "report.html").exists()
    assert (report / "crosstab_scatter.png").exists()
    assert run("evaluate", "adult_joint", "--no-report", db=store_path,
               user="alice").returncode == 6
    assert "range" in run("releases", "synthesizers", db=store_path).stdout


def test_an_interrupted_release_says_its_charge_stays(store_path):
    # Ctrl-C once the job is charged and reports progress (as the progress bar sees a
    # pressed Ctrl-C): a real process; the job is cancelled, its worker stopped.
    code = ("import sys\nfrom dpsql.cli import main, sigint\nsigint.seen = lambda: True\n"
            "sys.argv = ['dpsql', 'release', 'adult', '--synth', 'independent', '--epsilon', "
            "'0.5', '--columns', 'sex', '--name', 'cut']\nmain()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "DPSQL_DB": str(store_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 130, done.stderr
    assert "interrupted: nothing was written (the charge of rho=" in done.stderr
    assert "stays)" in done.stderr
    jobs = json.loads(run("jobs", "--json", db=store_path).stdout)
    assert [(j["name"], j["state"]) for j in jobs] == [("cut", "cancelled")]
    assert jobs[0]["error"].startswith("cancelled by admin; the charge of rho=")
    assert run("releases", "show", "cut", db=store_path).returncode == 7  # no release


def test_a_detached_release_and_the_jobs_list(store_path):
    detached = run("release", "adult", "--synth", "independent", "--epsilon", "0.5",
                   "--columns", "sex,race", "--name", "bg", "--detach", db=store_path)
    assert detached.returncode == 0, detached.stderr
    assert detached.stdout.startswith("job 1: charged and queued;")
    # This CLI owned the store: it ran the job before it exited.
    listed = run("jobs", db=store_path)
    assert listed.returncode == 0, listed.stderr
    header, _, row = listed.stdout.splitlines()
    assert header.split()[:7] == ["id", "state", "progress", "kind", "name", "dataset",
                                  "synthesizer"]
    assert row.split()[:7] == ["1", "succeeded", "write", "release", "bg", "adult",
                               "independent"]
    assert run("jobs", db=store_path, user="alice").returncode == 6  # analysts: refused
    refused = run("jobs", "cancel", "1", db=store_path)
    assert refused.returncode == 7
    assert "not queued or running" in refused.stderr
