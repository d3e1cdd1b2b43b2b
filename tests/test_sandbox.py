"""Sandbox processes (dpsql.sandbox): analyst SQL whose memory is never the owner's.

Real processes, each limited to 1 GiB (the least a sandbox takes), so that a
failing test cannot take the host's memory. No test waits for a time: each
waits for the condition it needs, with a deadline that only guards against a hang.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql import sandbox
from dpsql.engines.interrupt import Interrupter
from dpsql.errors import OutOfMemory, QueryCanceled
from dpsql.sandbox import SANDBOXES, Database, Sandboxes
from dpsql.sandboxed import open_file
from dpsql.store import HARDENED_CONFIG
from tests.waits import until

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")]

LIMIT = 2**30
#: The red team's reproduction: about 160 GB of strings, in chunks DuckDB does not count.
REPEAT = "SELECT max(length(repeat('ab', 400000000 + age))) FROM t"
ENDLESS = "SELECT count(*) FROM range(1000000000000000) a(i)"


@pytest.fixture
def database(tmp_path: Path) -> Database:
    path = tmp_path / "free.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t AS SELECT i % 90 AS age FROM range(200) r(i)")
    config = {**HARDENED_CONFIG, "memory_limit": "512MiB", "temp_directory": "spill"}
    return Database("free", 1, open_file, (str(path), config))


@pytest.fixture
def pool() -> Iterator[Sandboxes]:
    made = Sandboxes()
    made.configure(LIMIT)
    yield made
    made.close()


def status(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/PID/status`` in bytes (VmHWM: the peak resident memory)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def gone(pid: int) -> bool:
    """True once ``pid`` has ended, or is a zombie (its first thread ended; others may not yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def one(table: pa.Table) -> object:
    return table.column(0)[0].as_py()


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``fn`` on a thread; the list gets what it returned or raised."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as err:  # the test looks at it
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def stopped(interrupts: Interrupter, thread: threading.Thread) -> bool:
    """Interrupt the statement (again), and say whether ``thread`` has ended."""
    interrupts.interrupt()
    return not thread.is_alive()


def test_a_query_past_the_limit_fails_cleanly_and_the_owner_keeps_its_memory(
        pool: Sandboxes, database: Database) -> None:
    assert one(pool.run(database, "SELECT count(*) FROM t", user="alice")) == 200
    first = pool.pids()
    before = status(os.getpid(), "VmHWM")
    with pytest.raises(OutOfMemory, match="needs more memory than free queries may use"):
        pool.run(database, REPEAT, user="alice")
    # Before sandboxes, this process's resident memory grew until the OOM killer came.
    assert status(os.getpid(), "VmHWM") - before < 200 * 2**20
    assert one(pool.run(database, "SELECT count(*) FROM t", user="bob")) == 200
    assert not set(first) & set(pool.pids())  # the one that ran out of memory was replaced


def test_an_answer_larger_than_the_owner_takes_is_refused(pool: Sandboxes,
                                                          database: Database) -> None:
    with pytest.raises(OutOfMemory, match="larger than a free query may return"):
        pool.run(database, "SELECT repeat('x', 1000000) AS s FROM range(400)", user="alice")
    assert one(pool.run(database, "SELECT 42", user="alice")) == 42


def test_a_sandbox_killed_while_idle_is_replaced(pool: Sandboxes, database: Database) -> None:
    assert one(pool.run(database, "SELECT 1", user="alice")) == 1
    (pid,) = pool.pids()
    os.kill(pid, signal.SIGKILL)
    until(lambda: pid not in pool.pids(), "the sandbox did not die")  # all its threads ended
    assert one(pool.run(database, "SELECT count(*) FROM t", user="alice")) == 200
    assert pool.pids()


def test_a_sandbox_that_dies_during_a_query_answers_out_of_memory(
        pool: Sandboxes, database: Database) -> None:
    thread, outcome = in_thread(lambda: pool.run(database, ENDLESS, user="alice"))
    until(lambda: pool.pids(), "no sandbox started")
    (pid,) = pool.pids()
    os.kill(pid, signal.SIGKILL)  # what the kernel's OOM killer does
    thread.join(120)
    assert not thread.is_alive()
    assert isinstance(outcome[0], OutOfMemory)
    assert one(pool.run(database, "SELECT 7", user="alice")) == 7


def endless(pool: Sandboxes, database: Database, interrupts: Interrupter,
            user: str = "alice") -> Callable[[], pa.Table]:
    """A statement that runs an endless free query, stopped only through ``interrupts``."""
    def run() -> pa.Table:
        with interrupts.statement():
            return pool.run(database, ENDLESS, user=user, interrupts=interrupts)
    return run


def test_an_interrupt_the_query_ignores_kills_its_sandbox(pool: Sandboxes,
                                                          database: Database) -> None:
    """A query that goes on after its interrupt (here: stopped, so it cannot even read it)
    is stopped by killing its sandbox, KILL_AFTER later; the next query gets a new one."""
    interrupts = Interrupter()
    thread, outcome = in_thread(endless(pool, database, interrupts))
    until(lambda: pool.pids(), "no sandbox started")
    (pid,) = pool.pids()
    os.kill(pid, signal.SIGSTOP)
    try:
        until(lambda: stopped(interrupts, thread), "the query was not stopped", every=0.1)
        assert isinstance(outcome[0], QueryCanceled)
        until(lambda: gone(pid), "the sandbox was not killed")
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)
    assert one(pool.run(database, "SELECT 8", user="alice")) == 8


def test_a_statement_timeout_interrupts_the_query_and_the_next_is_answered(
        pool: Sandboxes, database: Database) -> None:
    interrupts = Interrupter()
    thread, outcome = in_thread(endless(pool, database, interrupts))
    until(lambda: pool.pids(), "no sandbox started")
    until(lambda: stopped(interrupts, thread), "the query was not stopped", every=0.1)
    assert isinstance(outcome[0], QueryCanceled)
    assert one(pool.run(database, "SELECT 9", user="alice")) == 9


def test_one_user_never_holds_every_sandbox(monkeypatch: pytest.MonkeyPatch,
                                            pool: Sandboxes, database: Database) -> None:
    monkeypatch.setattr(sandbox, "PROCESSES", 3)  # alice may hold 2 of them
    interrupts = [Interrupter() for _ in range(3)]
    alices = [in_thread(endless(pool, database, i)) for i in interrupts]
    until(lambda: len(pool.pids()) == 2, "alice's first two queries did not start")
    # Alice's third query waits for one of hers; Bob's is answered meanwhile.
    assert one(pool.run(database, "SELECT 10", user="bob")) == 10
    for interrupter, (thread, outcome) in zip(interrupts, alices, strict=True):
        until(functools.partial(stopped, interrupter, thread), "alice's query did not stop",
              every=0.1)
        assert isinstance(outcome[0], QueryCanceled)


def test_the_sandbox_limits_itself_and_sees_nothing_of_its_owner(
        monkeypatch: pytest.MonkeyPatch, pool: Sandboxes, database: Database) -> None:
    monkeypatch.setenv("PGPASSWORD", "owner-secret-7")
    monkeypatch.setenv("PYTHONSTARTUP", "/nonexistent/startup.py")
    assert one(pool.run(database, "SELECT 1", user="alice")) == 1
    (pid,) = pool.pids()
    limits = Path(f"/proc/{pid}/limits").read_text()
    line = next(x for x in limits.splitlines() if x.startswith("Max address space"))
    assert line.split()[3:5] == [str(LIMIT), str(LIMIT)]  # soft and hard
    environment = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"owner-secret-7" not in environment
    assert b"PYTHONSTARTUP" not in environment
    assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1] == b"-I"
    assert cwd(pid).stat().st_mode & 0o777 == 0o700
    assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000"


OWNER = """\
import sys
from pathlib import Path
from dpsql.sandbox import SANDBOXES, Database, Sandboxes
from dpsql.sandboxed import open_file
pool = Sandboxes()
pool.configure(2**30)
pool.run(Database("free", 1, open_file, (sys.argv[1], {})), "SELECT 1", user="alice")
print(pool.pids()[0], flush=True)
sys.stdin.read()
"""


def cwd(pid: int) -> Path:
    return Path(os.readlink(f"/proc/{pid}/cwd"))


def test_a_sandbox_dies_with_its_owner(database: Database) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, database.args[0]],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        folder = cwd(pid)
        assert not gone(pid)
        owner.kill()  # no close, no cleanup: the pipe closes with the process
        owner.wait()
        until(lambda: gone(pid), "the sandbox outlived its owner")
        assert not folder.exists()  # the sandbox removed it
    finally:
        owner.kill()
        owner.wait()
        for stream in (owner.stdin, owner.stdout):
            if stream is not None:
                stream.close()


def test_free_queries_of_a_session_run_in_a_sandbox(store_path: Path) -> None:
    """The reproduction through the Python API: the session's process keeps its memory."""
    with dpsql.connect(store_path, "admin") as admin:
        admin.release("adult", synthesizer="independent", name="adult_syn", epsilon=1,
                      rows=200, columns=["age", "sex"], seed=7)
    with dpsql.connect(store_path, "alice") as alice:
        alice.store[SANDBOXES].configure(LIMIT)
        assert alice.sql("SELECT count(*) AS n FROM released.adult_syn").table.to_pylist() \
            == [{"n": 200}]
        before = status(os.getpid(), "VmHWM")
        with pytest.raises(OutOfMemory):
            alice.sql("SELECT max(length(repeat('ab', 400000000 + age))) "
                      "FROM released.adult_syn")
        assert status(os.getpid(), "VmHWM") - before < 200 * 2**20
        assert alice.sql("SELECT count(*) AS n FROM released.adult_syn").table.to_pylist() \
            == [{"n": 200}]
        assert alice.store[SANDBOXES].pids()
    assert not alice.store[SANDBOXES].pids()  # closing the store ended them
