"""The release worker: its own interpreter, never the caller's __main__, started before the charge.

And its temporary folder: removed however the job ends, also when its owner is
killed before the job row records it, and the worker's spills stay inside it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

import dpsql
from dpsql import scratch
from dpsql.errors import ReleaseError
from dpsql.synth import base
from dpsql.synth.histogram import Independent

from .conftest import release_policy
from .test_jobs import gone
from .test_release import last_audit, released_tables, spent

ROOT = Path(__file__).resolve().parents[2]

#: docs/releases.md's example pasted into a file as it is: no __main__ guard.
NO_GUARD = """
import dpsql

with dpsql.connect({path!r}, user="admin") as admin:
    result = admin.release("adult", synthesizer="joint", epsilon=1, name="adult_projected",
                           columns=["age", "sex", "race", "income_50k"], copies=2,
                           postprocess="project")
    print("released", result.table)
"""

#: A synthesizer defined in the script that runs: a worker cannot load it.
IN_MAIN = """
from dataclasses import dataclass
from typing import ClassVar

import dpsql
from dpsql.synth import register
from dpsql.synth.histogram import Independent


@register("slow")  # a name the test policy lists
@dataclass
class Mine(Independent):
    name: ClassVar[str] = "slow"


if __name__ == "__main__":
    with dpsql.connect({path!r}, user="admin") as admin:
        try:
            admin.release("adult", synthesizer="slow", epsilon=1, name="mine", rows=5)
        except dpsql.ReleaseError as err:
            print(err)
"""


def run_script(text: str, folder: Path) -> subprocess.CompletedProcess[str]:
    script = folder / "script.py"
    script.write_text(text)
    return subprocess.run([sys.executable, str(script)], cwd=folder, capture_output=True,
                          text=True, timeout=600)


def test_a_script_with_no_main_guard_releases(release_store, tmp_path):
    done = run_script(NO_GUARD.format(path=str(release_store)), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["released released.adult_projected"]  # ran once
    with dpsql.connect(release_store, "admin") as session:
        assert released_tables(session) == ["adult_projected"]
        assert spent(session) == session.cost(epsilon=1)
        assert [j["state"] for j in session.jobs().list()] == ["succeeded"]


#: Modules another local user plants where the owner runs: the worker must import none.
PLANTED = ("signal", "json", "numpy", "duckdb", "dpsql")


@pytest.mark.parametrize("how", ["script", "the dpsql command"])
def test_a_worker_imports_nothing_planted_in_the_current_folder(release_store, tmp_path, how):
    """A red-team finding: ``python -c`` put the current folder first on the worker's path,
    so a ``signal.py`` in a shared folder (the owner's current folder, not its script's
    folder, which the script trusts by running from it) ran as the store's owner."""
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir()
    private.mkdir()
    evidence = tmp_path / "evidence"
    for name in PLANTED:
        (shared / f"{name}.py").write_text(
            f"open({str(evidence)!r}, 'a').write('{name} ran\\n')\nraise ImportError\n")
    if how == "script":
        script = private / "script.py"
        script.write_text(NO_GUARD.format(path=str(release_store)))
        command = [sys.executable, str(script)]
    else:
        command = [str(Path(sys.executable).with_name("dpsql")), "release", "adult", "--synth",
                   "independent", "--epsilon", "1", "--name", "from_cli", "--columns", "sex",
                   "--db", str(release_store)]
    done = subprocess.run(command, cwd=shared, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert not evidence.exists(), evidence.read_text()


@pytest.mark.parametrize("python", ["missing", "exits_at_once"])
def test_a_worker_that_cannot_start_is_refused_uncharged(admin_session, tmp_path, monkeypatch,
                                                          python):
    broken = tmp_path / python
    if python == "exits_at_once":
        broken.write_text("#!/bin/sh\nexit 3\n")
        broken.chmod(0o700)
    monkeypatch.setattr(sys, "executable", str(broken))
    before = spent(admin_session)
    with pytest.raises(ReleaseError, match=r"release worker .*; nothing was charged"):
        admin_session.release("adult", synthesizer="independent", epsilon=1, name="never",
                              columns=["sex"], rows=5)
    assert spent(admin_session) == before
    assert admin_session.jobs().list() == []
    assert released_tables(admin_session) == []
    audit = last_audit(admin_session)
    assert (audit["outcome"], audit["action"]) == ("refused", "release")
    assert "release worker" in audit["reason"]


def test_a_synthesizer_defined_in_main_is_refused_before_the_charge(release_store, tmp_path):
    done = run_script(IN_MAIN.format(path=str(release_store)), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "cannot load its work" in done.stdout
    assert "define it in a module" in done.stdout
    with dpsql.connect(release_store, "admin") as session:
        assert spent(session).units == 0
        assert session.jobs().list() == []
        assert last_audit(session)["outcome"] == "refused"


# -- the job's folder ---------------------------------------------------------------------

STALLED_OWNER = """
import sys
import time

import dpsql
from dpsql import jobs
from dpsql.release import ReleaseRequest

record = jobs._move


def stalled(store, job_id, old, new, **values):
    # The job row's write of its folder (as it starts running) waits behind other
    # writers: here, for ever.
    if "folder" in values:
        print(values["folder"], flush=True)
        time.sleep(600)
    record(store, job_id, old, new, **values)


jobs._move = stalled
session = dpsql.connect(sys.argv[1], "admin")
session.submit(ReleaseRequest("adult", "independent", "cut", epsilon=1, columns=["sex"], rows=5))
time.sleep(600)
"""


def test_a_folder_its_job_row_never_recorded_is_swept_after_kill_9(release_store):
    with subprocess.Popen([sys.executable, "-c", STALLED_OWNER, str(release_store)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=ROOT) as owner:
        try:
            line = owner.stdout.readline()
            folder = Path(line.strip())
            assert folder.name.startswith("dpsql-release-"), owner.stderr.read()
            assert folder.is_dir()
        finally:
            owner.send_signal(signal.SIGKILL)
            owner.wait(30)
    with dpsql.connect(release_store, "admin") as session:
        assert not folder.exists()
        [job] = session.jobs().list()
        assert job["state"] == "interrupted"
        assert gone(job["worker_pid"]), "the idle worker outlived its owner"


def test_the_sweep_keeps_live_owners_and_other_stores(tmp_path):
    store, other = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    store.touch()
    other.touch()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()

    def left(by: Path, pid: int) -> Path:
        path = Path(tempfile.mkdtemp(prefix=scratch.PREFIX))
        marker = {"store": str(by), "file": None, "pid": pid, "started": None,
                  "pid_namespace": scratch._pid_namespace()}
        (path / scratch.MARKER).write_text(json.dumps(marker))
        return path

    dead_here, dead_other = left(store, ended.pid), left(other, ended.pid)
    unmarked = Path(tempfile.mkdtemp(prefix=scratch.PREFIX))
    try:
        with scratch.folder(store) as live:
            assert scratch.sweep(store) == [dead_here]
            assert [p.is_dir() for p in (live, dead_other, unmarked)] == [True] * 3
        assert not live.exists()
    finally:
        for path in (dead_here, dead_other, unmarked):
            shutil.rmtree(path, ignore_errors=True)


@dataclass
class SpillDirectory(Independent):
    """Reports where its source's DuckDB spills (as a progress stage), then fits."""

    name: ClassVar[str] = "spill_directory"

    def fit(self, source, domain, budget, rng, progress=None):
        [(spill,)] = source.query("s", "SELECT current_setting('temp_directory')").fetchall()
        if progress is not None:
            progress(f"spill {os.path.abspath(spill)}", 1, 1)
        return super().fit(source, domain, budget, rng, progress)


@pytest.fixture
def spill_store(make_store) -> Iterator[Path]:
    base.register("spill_directory")(SpillDirectory)
    try:
        yield make_store(release_policy(synthesizers="independent, spill_directory"))
    finally:
        base.unregister("spill_directory")


def test_the_worker_spills_into_the_job_folder(spill_store):
    """DuckDB's default is ./.tmp, where a killed worker would leave bounded rows behind."""
    stages: list[str] = []
    with dpsql.connect(spill_store, "admin") as session:
        session.release("adult", synthesizer="spill_directory", epsilon=1, name="s",
                        columns=["sex"], rows=5, progress=lambda stage, *_: stages.append(stage))
        [folder] = session.store.cursor().execute("SELECT folder FROM dpsql.jobs").fetchone()
    [spill] = [s.removeprefix("spill ") for s in stages if s.startswith("spill ")]
    assert Path(spill).parent == Path(folder)
