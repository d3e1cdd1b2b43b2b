"""What dpsql creates on disk is its owner's alone, whatever the umask; nobody can squat it."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dpsql
from dpsql.errors import ConfigurationError
from dpsql.files import private_folder, runtime_dir, runtime_file, write_private

from .conftest import ADULT_POLICY, ADULT_SAMPLE

OTHERS = 0o077


def mode(path: Path) -> str:
    return stat.filemode(path.stat().st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The usual umask 022 (files 0644), restored afterwards."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def dpsql_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The dpsql CLI in a process of its own, started under umask 022."""
    return subprocess.run([sys.executable, "-m", "dpsql", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, preexec_fn=lambda: os.umask(0o022),
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env})


def test_init_under_umask_022_makes_the_store_and_every_wal_private(tmp_path):
    store = tmp_path / "adult.duckdb"
    made = dpsql_cli("init", str(store), "--policy", str(ADULT_POLICY), "--import",
                     f"adult={ADULT_SAMPLE}", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert mode(store) == "-rw-------"
    # DuckDB deleted the WAL when init closed the store (a checkpoint) and makes a new one
    # at the next write (here the query's charge) with the process's umask.
    assert not (tmp_path / "adult.duckdb.wal").exists()
    script = (f"import dpsql, os\nos.umask(0o022)\n"
              f"with dpsql.connect({str(store)!r}, 'admin') as s:\n"
              "    s.sql('SELECT COUNT(*) FROM adult')\n"
              f"    print(oct(os.stat({str(store) + '.wal'!r}).st_mode & 0o777))\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "0o600"


def test_a_store_others_can_read_is_made_private_with_a_notice(store_path, loose_umask, caplog):
    store_path.chmod(0o644)
    with caplog.at_level(logging.WARNING, "dpsql.files"), dpsql.connect(store_path, "alice"):
        pass
    assert mode(store_path) == "-rw-------"
    assert "could be read by other users" in caplog.text
    assert "chmod 600" in caplog.text


@pytest.mark.skipif(os.getuid() != 0, reason="making a file of another uid needs root")
def test_a_store_of_another_user_that_others_can_read_is_refused(store_path):
    store_path.chmod(0o644)
    os.chown(store_path, 65534, -1)
    with pytest.raises(dpsql.StoreError, match="its owner should run: chmod 600"):
        dpsql.connect(store_path, "alice")


def test_export_and_draft_are_private_unless_asked(tmp_path, store_path):
    with dpsql.connect(store_path, "admin") as admin:
        admin.release("adult", synthesizer="independent", name="syn", epsilon=1, rows=50, seed=1)
    out = dpsql_cli("export", "syn", "syn.parquet", "--db", str(store_path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert mode(tmp_path / "syn.parquet") == "-rw-------"
    shared = dpsql_cli("export", "syn", "shared.parquet", "--mode", "644", "--db",
                       str(store_path), cwd=tmp_path)
    assert shared.returncode == 0, shared.stderr
    assert mode(tmp_path / "shared.parquet") == "-rw-r--r--"
    bad = dpsql_cli("export", "syn", "x.parquet", "--mode", "999", "--db", str(store_path),
                    cwd=tmp_path)
    assert bad.returncode == 2
    assert "not an octal file mode" in bad.stderr
    draft = tmp_path / "draft.yaml"
    draft.write_text("old")
    draft.chmod(0o644)  # overwritten in place: the old mode must not survive
    drafted = dpsql_cli("policy", "draft", str(ADULT_SAMPLE), "-o", str(draft), cwd=tmp_path)
    assert drafted.returncode == 0, drafted.stderr
    assert mode(draft) == "-rw-------"


# -- the runtime folder of admin sockets -----------------------------------------------------
@pytest.fixture
def shared_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A shared temporary folder and a home of our own, with no XDG_RUNTIME_DIR."""
    shared = tmp_path / "tmp"
    shared.mkdir(mode=0o1777)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    return shared


def test_the_runtime_folder_is_made_private(shared_tmp):
    folder = runtime_dir()
    assert folder == shared_tmp / f"dpsql-{os.getuid()}"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert runtime_dir() == folder  # found again: server and clients agree


def test_a_runtime_folder_name_squatted_by_a_symlink_is_passed_over(shared_tmp, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (shared_tmp / f"dpsql-{os.getuid()}").symlink_to(target)
    folder = runtime_dir()
    assert folder == Path(os.environ["HOME"]) / ".cache" / "dpsql-run"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder of another uid needs root")
def test_a_runtime_folder_another_user_made_first_is_passed_over(shared_tmp):
    squatted = shared_tmp / f"dpsql-{os.getuid()}"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, 65534, 65534)  # nobody's: made before us by another local user
    folder = runtime_dir()
    assert folder == Path(os.environ["HOME"]) / ".cache" / "dpsql-run"
    assert folder.stat().st_uid == os.getuid()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_runtime_folder_of_ours_that_others_may_use_is_refused(shared_tmp):
    folder = runtime_dir()
    folder.chmod(0o755)
    with pytest.raises(ConfigurationError, match="is not a private directory"):
        runtime_dir()


# -- output files: nothing planted where dpsql writes is followed or reused ------------------
def test_write_private_replaces_a_planted_link_and_never_follows_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "out.yaml"
    target.symlink_to(victim)
    write_private(target, "draft")
    assert victim.read_text() == "precious"
    assert not target.is_symlink()
    assert target.read_text() == "draft"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.yaml", "victim"]  # no temporary


def test_a_failed_write_leaves_no_partial_file(tmp_path):
    def broken(out):
        out.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_private(tmp_path / "out.parquet", broken)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.getuid() != 0, reason="making a file of another uid needs root")
def test_a_file_another_user_planted_is_replaced_not_written_into(tmp_path):
    """A red-team finding: a 0666 file of another user received the draft and stayed theirs."""
    target = tmp_path / "draft.yaml"
    target.write_text("")
    target.chmod(0o666)
    os.chown(target, 65534, 65534)
    write_private(target, "bounds read from the rows")
    assert target.stat().st_uid == os.getuid()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_export_through_a_planted_link_leaves_its_target_alone(tmp_path, store_path):
    with dpsql.connect(store_path, "admin") as admin:
        admin.release("adult", synthesizer="independent", name="syn", epsilon=1, rows=50, seed=1)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "syn.parquet").symlink_to(victim)
    out = dpsql_cli("export", "syn", "syn.parquet", "--db", str(store_path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert victim.read_text() == "precious"
    assert (tmp_path / "syn.parquet").read_bytes()[:4] == b"PAR1"


def test_a_report_folder_others_may_write_into_is_refused(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(ConfigurationError, match="only you may write into"):
        private_folder(loose)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(ConfigurationError, match="not a folder of yours"):
        private_folder(link)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    assert stat.S_IMODE(private_folder(mine).stat().st_mode) == 0o700
    assert stat.S_IMODE(private_folder(tmp_path / "new" / "report").stat().st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder of another uid needs root")
def test_a_server_and_its_clients_meet_after_a_squat_is_removed(shared_tmp):
    """A red-team finding: the server settled in ~/.cache/dpsql-run while /tmp was squatted;
    once the squatter removed it, clients made /tmp/dpsql-<uid> and found no server there."""
    squatted = shared_tmp / f"dpsql-{os.getuid()}"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, 65534, 65534)
    socket_file = runtime_file("server.sock")  # where the server listens
    socket_file.touch()
    squatted.rmdir()  # the squatter goes away
    assert runtime_file("server.sock") == socket_file  # where a client looks
    assert runtime_file("other.sock").parent == squatted  # a new server takes /tmp again
