"""Over the wire: a free or catalog query cannot take the server's memory.

The red team's reproduction: strings DuckDB does not count against its
``memory_limit`` (``repeat``) grew the server past 4 GB until the kernel killed
it, every session with it. Free and catalog queries now run in sandbox
processes with a hard address-space limit (1 GiB here). The server process
itself runs under a 4 GiB limit, so that a regression fails these tests
instead of the host: its peak resident memory must not move.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.waits import until

from .conftest import ServerProcess, start_server

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")]

SERVER_LIMIT = 4 * 2**30
#: Runs ``python -m dpsql`` with the address-space limit of its first argument.
CAPPED = ("import resource, runpy, sys; cap = int(sys.argv.pop(1)); "
          "resource.setrlimit(resource.RLIMIT_AS, (cap, cap)); sys.argv[0] = 'dpsql'; "
          "runpy.run_module('dpsql', run_name='__main__', alter_sys=True)")
FREE = "SELECT max(length(repeat('ab', 400000000 + age))) FROM released.adult_syn"
CATALOG = "SELECT max(length(repeat('ab', 10000000 + oid::int % 7))) FROM pg_catalog.pg_class"
GROWTH = 200 * 2**20  # what the server's peak resident memory may grow by


@pytest.fixture(scope="module")
def server(server_store: Path) -> Iterator[ServerProcess]:
    args = [sys.executable, "-c", CAPPED, str(SERVER_LIMIT), "serve", "--db", str(server_store),
            "--port", "0", "--free-query-memory", "1GiB"]
    with start_server(args) as running:
        yield running


def peak(pid: int) -> int:
    """The peak resident memory of process ``pid`` so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise KeyError("VmHWM")


def sandboxes(pid: int) -> set[int]:
    """The sandbox processes that server ``pid`` runs now."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            parent = (entry / "stat").read_text().rpartition(")")[2].split()[1]
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if parent == str(pid) and b"dpsql.sandboxed" in command:
            found.add(int(entry.name))
    return found


def ended(pid: int) -> bool:
    """True once every thread of process ``pid`` has ended (it is gone, or a zombie)."""
    try:
        states = [(task / "stat").read_text().rpartition(")")[2].split()[0]
                  for task in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return True
    return all(state in ("Z", "X") for state in states)


def count(server: ServerProcess, user: str, sql: str) -> int:
    with psycopg.connect(server.dsn(user), autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("sql", [FREE, CATALOG], ids=["free", "catalog"])
def test_a_query_past_the_memory_limit_is_refused_and_the_server_goes_on(
        server: ServerProcess, sql: str) -> None:
    pid = server.process.pid
    with psycopg.connect(server.dsn("alice"), autocommit=True) as alice, \
            psycopg.connect(server.dsn("erin"), autocommit=True) as erin:
        assert alice.execute("SELECT count(*) FROM released.adult_syn").fetchone() == (200,)
        assert alice.execute("SELECT count(*) > 0 FROM pg_catalog.pg_class").fetchone() == (True,)
        before = peak(pid)
        with pytest.raises(psycopg.errors.OutOfMemory,
                           match="needs more memory than free queries may use") as caught:
            alice.execute(sql)
        assert caught.value.sqlstate == "53200"
        assert peak(pid) - before < GROWTH
        assert server.alive()
        # The same connection, another session's and a new one are answered.
        assert alice.execute("SELECT count(*) FROM released.adult_syn").fetchone() == (200,)
        assert erin.execute("SELECT count(*) FROM released.adult_syn").fetchone() == (200,)
        assert erin.execute("SELECT count(*) FROM pg_catalog.pg_class "
                            "WHERE relname = 'adult_syn'").fetchone() == (1,)
    assert count(server, "frank", "SELECT count(*) FROM released.adult_syn") == 200


def test_a_killed_sandbox_is_replaced_and_the_next_free_query_answered(
        server: ServerProcess) -> None:
    pid = server.process.pid
    assert count(server, "alice", "SELECT count(*) FROM released.adult_syn") == 200
    killed = sandboxes(pid)
    assert killed
    for sandbox in killed:
        os.kill(sandbox, signal.SIGKILL)
    until(lambda: all(ended(sandbox) for sandbox in killed), "the sandboxes did not die")
    assert count(server, "alice", "SELECT count(*) FROM released.adult_syn") == 200
    assert count(server, "erin", "SELECT count(*) FROM pg_catalog.pg_class "
                                 "WHERE relname = 'adult_syn'") == 1
    assert sandboxes(pid)
    assert not sandboxes(pid) & killed
