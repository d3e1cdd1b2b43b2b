"""A served store stays administrable: dpsql commands go through the server's admin channel.

A real `dpsql serve`, real `dpsql` CLI processes and real psql/psycopg clients.
Each command here would fail with "open for writing by another process" if it
opened the file itself, so its success shows it ran in the server.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dpsql.server.admin import connect, receive, send, socket_path

from ..test_cli import _read_until
from .conftest import SERVER_POLICY, ServerProcess, make_store, serve_args, start_server


@pytest.fixture(scope="module")
def runtime() -> Iterator[Path]:
    """A short private runtime directory (Unix socket paths are limited to ~107 bytes)."""
    base = Path(tempfile.mkdtemp(prefix="dpq", dir="/tmp"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_RUNTIME_DIR", str(base))
        yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def store(runtime: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(tmp_path_factory.mktemp("admin") / "adult.duckdb")


@pytest.fixture(scope="module")
def served(store: Path) -> Iterator[ServerProcess]:
    with start_server(serve_args(store)) as server:
        yield server


def dpsql(*args: str, cwd: Path | None = None, stdin: str | None = None,
          **env: str) -> subprocess.CompletedProcess[str]:
    """The dpsql CLI in its own process."""
    return subprocess.run([sys.executable, "-m", "dpsql", *args], input=stdin, cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env})


def test_admin_commands_run_in_the_server(served, store):
    grant = dpsql("budget", "grant", "frank", "adult", "--epsilon", "0.5", "--db", str(store))
    assert grant.returncode == 0, grant.stderr
    budgets = json.loads(dpsql("budget", "show", "--json", "--db", str(store)).stdout)
    frank = next(b for b in budgets if b["user"] == "frank")
    assert frank["granted"]["epsilon"] == "1.5"
    audit = json.loads(dpsql("audit", "--json", "--db", str(store)).stdout)
    assert any(r["action"] == "grant" and "frank" in r["statement"] for r in audit)
    shown = dpsql("policy", "show", "--db", str(store))
    assert shown.returncode == 0
    assert "adult" in shown.stdout
    releases = json.loads(dpsql("releases", "list", "--json", "--db", str(store)).stdout)
    assert [r["name"] for r in releases] == ["adult_syn"]
    jobs = dpsql("jobs", "--json", "--db", str(store))  # a group that runs without a command
    assert jobs.returncode == 0, jobs.stderr
    assert [j["name"] for j in json.loads(jobs.stdout)] == ["adult_syn"]
    assert any("admin channel: dpsql budget grant" in line for line in served.lines)


def test_environment_and_working_directory_are_the_callers(served, store, tmp_path):
    exported = dpsql("export", "adult_syn", "out.parquet", cwd=tmp_path, DPSQL_DB=str(store))
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "out.parquet").stat().st_size > 0
    as_analyst = dpsql("budget", "grant", "erin", "adult", "--epsilon", "1", "--db", str(store),
                       DPSQL_USER="alice")
    assert as_analyst.returncode == 6  # AccessDenied: $DPSQL_USER of the caller acted
    assert "alice is an analyst" in as_analyst.stderr


def test_a_new_password_works_at_once(served, store):
    added = dpsql("user", "add", "erin", "--password-stdin", "--db", str(store),
                  stdin="erin-new-secret\n")
    assert added.returncode == 0, added.stderr
    with psycopg.connect(served.dsn("erin", "erin-new-secret"), autocommit=True) as conn:
        assert conn.execute("SHOW dpsql.budget").fetchall()


def test_exit_codes_and_stderr_pass_through(served, store):
    missing = dpsql("releases", "show", "nope", "--db", str(store))
    assert (missing.returncode, missing.stdout) == (7, "")
    assert missing.stderr.startswith("error: no release named 'nope'")
    as_json = dpsql("releases", "show", "nope", "--json", "--db", str(store))
    assert json.loads(as_json.stdout)["error"] == "release_error"


def test_a_prompt_at_the_end_of_input_aborts(served, store):
    local = dpsql("user", "add", "frank", "--db", str(store), stdin="")
    assert local.returncode == 8  # piped input holds no password: said so, never a loop
    assert "no password on standard input" in local.stderr
    assert "Warning" not in local.stderr
    with psycopg.connect(served.dsn("admin"), autocommit=True) as conn, \
            pytest.raises(psycopg.Error) as over_sql:
        conn.execute("CALL dpsql('user add frank')")
    assert "aborted" in str(over_sql.value)


def test_release_while_an_analyst_queries(served, store):
    answers: list[int] = []
    stop = threading.Event()

    def analyst() -> None:
        with psycopg.connect(served.dsn("carol"), autocommit=True) as conn:
            while not stop.is_set():
                conn.execute("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.001) "
                             "COUNT(*) FROM adult").fetchall()
                answers.append(1)

    worker = threading.Thread(target=analyst)
    worker.start()
    try:
        released = dpsql("release", "adult", "--synth", "independent", "--epsilon", "0.5",
                         "--rows", "100", "--columns", "age,sex", "--name", "via_channel",
                         "--db", str(store))
        during = len(answers)
        time.sleep(0.5)
    finally:
        stop.set()
        worker.join(timeout=60)
    assert released.returncode == 0, released.stderr
    assert "released released.via_channel" in released.stdout
    assert during > 0
    assert len(answers) > during
    with psycopg.connect(served.dsn("alice"), autocommit=True) as conn:
        assert conn.execute("SELECT COUNT(*) FROM released.via_channel").fetchone() == (100,)


def test_ctrl_c_cancels_the_command_in_the_server(served, store, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text((store.parent / "server_policy.yaml").read_text()
                      .replace("alice: {role: analyst, budgets: {adult: {epsilon: 5}}}",
                               "alice: {role: analyst, budgets: {adult: {epsilon: 6}}}"))
    before = dpsql("policy", "show", "--db", str(store)).stdout
    client = subprocess.Popen([sys.executable, "-m", "dpsql", "policy", "apply", str(policy),
                               "--db", str(store)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        time.sleep(3)  # the server waits for the confirmation the client never types
        assert client.poll() is None
        client.send_signal(signal.SIGINT)
        _, err = client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode in (1, 130), err  # aborted, as at a local prompt
    assert dpsql("policy", "show", "--db", str(store)).stdout == before
    assert dpsql("budget", "show", "--db", str(store)).returncode == 0  # the server goes on


@pytest.mark.slow  # about 20 s: a store, a server and a NAPSU-MQ fit to stop
@pytest.mark.ci  # the charge of a stopped release stays
def test_ctrl_c_stops_a_release_in_the_server_and_the_charge_stays(runtime, tmp_path):
    policy = SERVER_POLICY.replace("accounting: pure", "accounting: zcdp\ndelta: 1.0e-6").replace(
        "synthesizers: [independent]", "synthesizers: [independent, napsu_mq]")
    store = make_store(tmp_path / "zcdp.duckdb", policy)
    with start_server(serve_args(store)) as server:
        _interrupt_a_release(store)
        with psycopg.connect(server.dsn("admin"), autocommit=True) as conn:
            conn.execute("SET statement_timeout = 5000")
            with pytest.raises(psycopg.Error) as timed_out:
                conn.execute("CALL dpsql('release adult --synth napsu_mq --epsilon 0.5 "
                             "--columns age,sex,race,income_50k --name stopped_too')")
            assert timed_out.value.sqlstate == "57014"
            released = conn.execute("SHOW dpsql.released").fetchall()  # after the CALL ended
        audit = json.loads(dpsql("audit", "--json", "--db", str(store)).stdout)
        assert dpsql("budget", "show", "--db", str(store)).returncode == 0  # the server goes on
    assert "stopped" not in str(released)  # neither release wrote a table
    releases = [r for r in audit if r["action"] == "release"][-2:]
    # Both were cancelled (Ctrl-C, the statement timeout) and both keep their charge.
    assert [(r["outcome"], r["cost"] is not None) for r in releases] == [("cancelled", True)] * 2
    assert all("stays" in r["reason"] for r in releases), releases  # "the charge of ... stays"


def _interrupt_a_release(store: Path) -> None:
    terminal, stderr = pty.openpty()  # a terminal, so that the progress bar shows
    fcntl.ioctl(stderr, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        with subprocess.Popen(
                [sys.executable, "-m", "dpsql", "release", "adult", "--synth", "napsu_mq",
                 "--epsilon", "0.5", "--columns", "age,sex,race,income_50k", "--name",
                 "stopped", "--db", str(store)], stdout=subprocess.DEVNULL, stderr=stderr,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}) as release:
            os.close(stderr)
            shown = _read_until(terminal, b"fit")  # charged, fitting: a long stage
            release.send_signal(signal.SIGINT)
            code = release.wait(timeout=120)
            shown += _read_until(terminal, b"\ninterrupted")
    finally:
        os.close(terminal)
    assert code == 130, shown.decode(errors="replace")[-2000:]
    assert b"nothing was written" in shown


def test_a_second_server_is_refused(served, store):
    second = dpsql("serve", "--db", str(store), "--port", "0")
    assert second.returncode == 9
    assert "dpsql serve already runs on this store" in second.stderr


@pytest.mark.parametrize(("target", "mode"), [("directory", 0o755), ("socket", 0o660)])
def test_a_channel_others_may_use_is_refused(served, store, target, mode):
    path = socket_path(store)
    assert path is not None
    victim = path.parent if target == "directory" else path
    original = victim.stat().st_mode & 0o777
    victim.chmod(mode)
    try:
        refused = dpsql("budget", "show", "--db", str(store))
    finally:
        victim.chmod(original)
    assert refused.returncode == 8
    assert f"is not a private {target}" in refused.stderr
    assert dpsql("budget", "show", "--db", str(store)).returncode == 0


def test_admin_call_over_the_wire(served, store):
    with psycopg.connect(served.dsn("admin"), autocommit=True) as conn:
        lines = conn.execute("CALL dpsql('budget grant dave adult --epsilon 0.25')").fetchall()
        assert lines[0] == ("granted epsilon=0.25 to dave on adult",)
        budgets = conn.execute("CALL dpsql('budget show --json')")
        columns = [c.name for c in budgets.description]
        rows = [dict(zip(columns, r, strict=True)) for r in budgets.fetchall()]
        assert json.loads(next(r for r in rows if r["user"] == "dave")["granted"])["epsilon"] \
            == "1.25"
        with pytest.raises(psycopg.Error) as wrong_user:
            conn.execute("CALL dpsql('budget grant dave adult --epsilon 1 --as alice')")
        assert "drop --as" in str(wrong_user.value)
        with pytest.raises(psycopg.Error) as too_long:  # refused before any pure-Python split
            conn.execute(f"CALL dpsql('releases show {'a' * 70_000}')")
        assert "at most 65,536 are read" in str(too_long.value)
    with psycopg.connect(served.dsn("alice"), autocommit=True) as conn, \
            pytest.raises(psycopg.Error) as refused:
        conn.execute("CALL dpsql('budget grant alice adult --epsilon 100')")
    assert refused.value.sqlstate == "42501"
    audit = json.loads(dpsql("audit", "--json", "--db", str(store)).stdout)
    calls = [(r["user"], r["outcome"], r["statement"]) for r in audit
             if r["action"] == "admin_call"]
    assert ("admin", "done", "CALL dpsql('budget grant dave adult --epsilon 0.25')") in calls
    assert ("alice", "refused", "CALL dpsql('budget grant alice adult --epsilon 100')") in calls
    assert any(r["action"] == "grant" and "dave" in r["statement"] for r in audit)


def test_a_call_names_no_other_store_user_or_file(served, store, tmp_path):
    """A SQL administrator is not the server's OS user: no other store, user or server file."""
    other = make_store(tmp_path / "other.duckdb")
    policy = tmp_path / "policy.yaml"
    policy.write_text(SERVER_POLICY)
    out = tmp_path / "out.parquet"
    attempts = {f"jobs --db {other}": "drop --db", "jobs --as alice": "drop --as",
                f"budget show --db={other}": "drop --db", f"policy check {policy}": "no file",
                f"policy apply {policy} --yes": "no file", f"export adult_syn {out}": "no file",
                "export adult_syn -": "no file", "evaluate adult_syn": "no file",
                f"query -f {policy}": "no file"}
    with psycopg.connect(served.dsn("admin"), autocommit=True) as conn:
        for command, refusal in attempts.items():
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(f"CALL dpsql('{command}')")
            assert refused.value.sqlstate == "42501", command
            assert refusal in str(refused.value), command
        assert conn.execute("CALL dpsql('jobs --json')").fetchall()  # its own store's jobs
    assert not out.exists()
    assert not (store.parent / "adult_syn_report").exists()


def test_the_socket_runs_typed_operations_only(served, store):
    """A request names an operation and its typed arguments: no argv, path or session."""
    from dpsql.admin import budgets, wire

    sock = connect(store)
    assert sock is not None
    with sock:
        send(sock, {"op": "budget.show", "user": None, "args": {"user": "alice"}})
        shown = wire.decode_result(budgets.show_budgets, receive(sock)["result"])
        assert [b.user for b in shown.budgets] == ["alice"]
        for request, refusal in (
                ({"argv": ["budget", "show"]}, "no administrative operation"),
                ({"op": "policy.check", "args": {"path": "/etc/passwd"}}, "no argument 'path'"),
                ({"op": "budget.show", "args": {"session": None}}, "no argument 'session'"),
                ({"op": "budget.show", "user": "nobody", "args": {}}, "nobody"),
                # a value of the wrong JSON type is refused, not converted (bool("false"))
                ({"op": "release.list", "args": {"include_superseded": "false"}},
                 "expected bool, got str"),
                ({"op": "audit", "args": {"last": "5"}}, "expected int, got str")):
            send(sock, request)
            reply = receive(sock)
            assert reply is not None, request
            assert "result" not in reply, request
            assert refusal in reply["message"], (request, reply)
        send(sock, {"op": "budget.show", "user": "alice", "args": {}})  # the connection goes on
        assert "result" in receive(sock)
    deep = connect(store)  # a frame nested past any use ends its connection, and no more
    assert deep is not None
    with deep:
        body = b"[" * 200_000 + b"]" * 200_000
        deep.sendall(struct.pack(">I", len(body)) + body)
        deep.settimeout(60)
        assert receive(deep) is None  # closed, not left hanging
    again = connect(store)
    assert again is not None
    with again:
        send(again, {"op": "budget.show", "user": "alice", "args": {}})
        assert "result" in receive(again)


def test_jobs_run_in_the_server(served, store):
    listed = dpsql("jobs", "--json", "--db", str(store))
    assert listed.returncode == 0, listed.stderr
    assert all(job["state"] != "running" for job in json.loads(listed.stdout))


def test_a_stale_socket_is_ignored_and_replaced(runtime, tmp_path):
    store = make_store(tmp_path / "stale.duckdb")
    path = socket_path(store)
    assert path is not None
    path.parent.mkdir(mode=0o700, exist_ok=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # bound, never listening: nobody answers
    path.chmod(0o600)
    assert dpsql("budget", "show", "--db", str(store)).returncode == 0  # opened locally
    with start_server(serve_args(store)):
        shown = dpsql("budget", "show", "--db", str(store))
        assert shown.returncode == 0, shown.stderr
    assert not path.exists()  # removed on shutdown


def test_sigterm_cancels_a_running_release_and_the_charge_stays(runtime, tmp_path):
    """dpsql serve stops at once on SIGTERM: a fitting release is cancelled, nothing written."""
    import dpsql as api

    policy = SERVER_POLICY.replace("accounting: pure", "accounting: zcdp\ndelta: 1.0e-6").replace(
        "synthesizers: [independent]", "synthesizers: [independent, napsu_mq]")
    store = make_store(tmp_path / "term.duckdb", policy)
    with start_server(serve_args(store)) as server:
        for name in ("cut", "queued"):  # a fitting job and one queued behind it
            submitted = dpsql("release", "adult", "--synth", "napsu_mq", "--epsilon", "0.5",
                              "--columns", "age,sex,race,income_50k", "--name", name,
                              "--detach", "--db", str(store))
            assert submitted.returncode == 0, submitted.stderr
        deadline = time.monotonic() + 60
        while not any(j["state"] == "running" and j["stage"] for j in json.loads(
                dpsql("jobs", "--json", "--db", str(store)).stdout)):
            assert time.monotonic() < deadline, "the release never started"
            time.sleep(0.2)
        server.process.send_signal(signal.SIGTERM)
        # A hang guard: that the fits were stopped, not waited for, the jobs' states show.
        assert server.process.wait(timeout=120) == 0
    with api.connect(store, "admin") as session:
        jobs = [j for j in session.jobs().list() if j["name"] in ("cut", "queued")]
        tables = session.store.cursor().execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'released'"
        ).fetchall()
        audit = [r for r in session.audit() if r["action"] == "release"][-2:]
    assert [(j["state"], "server shutdown" in str(j["error"])) for j in jobs] == \
        [("cancelled", True)] * 2
    assert not {"cut", "queued"} & {t for (t,) in tables}
    assert [(r["outcome"], r["cost"] is not None) for r in audit] == [("cancelled", True)] * 2


def test_a_command_through_the_server_cannot_overwrite_or_read_the_store(served, store):
    """The admin socket's caller is the same uid, but the served store's files are off limits."""
    before = store.stat().st_size
    for args in (["policy", "draft", "--table", "adult", "-o", str(store)],
                 ["policy", "draft", "--table", "adult", "-o", f"{store}.wal"],
                 ["policy", "check", str(store)]):
        refused = dpsql(*args, "--db", str(store), cwd=store.parent)
        assert refused.returncode != 0, args
        assert "is a file of the served store" in refused.stderr, refused.stderr
    assert store.stat().st_size >= before
    assert dpsql("budget", "show", "--db", str(store)).returncode == 0  # still a store


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder of another uid needs root")
def test_a_runtime_folder_squatted_by_another_user_blocks_nothing(tmp_path, monkeypatch):
    """Another local user made <tmp>/dpsql-<our uid> first: serve and commands still work."""
    shared, home = tmp_path / "tmp", tmp_path / "home"
    shared.mkdir(mode=0o1777)
    home.mkdir(mode=0o700)
    squatted = shared / f"dpsql-{os.getuid()}"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, 65534, 65534)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setenv("HOME", str(home))
    store = make_store(tmp_path / "squat.duckdb")
    with start_server(serve_args(store)):
        shown = dpsql("budget", "show", "--db", str(store))
        assert shown.returncode == 0, shown.stderr
    assert list((home / ".cache" / "dpsql-run").iterdir()) == []  # its socket, now removed
