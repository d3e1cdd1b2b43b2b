"""A statement timeout stops all of a free query's work, the encoding of a large answer too.

DuckDB builds the answer below (8 million rows) in about a second; turning it
into wire messages in Python takes far longer, and used to go on, a core busy,
long after the client got 57014. Measured in the server's CPU time, not in
wall time: the work done after the answer against the work done before it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from .conftest import ServerProcess, serve_args, start_server

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")]

#: Free (released tables only), and 200**3 rows: quick for DuckDB, long to encode.
LARGE = ("SELECT a.sex FROM released.adult_syn a, released.adult_syn b, "
         "released.adult_syn c")


@pytest.fixture(scope="module")
def server(server_store: Path) -> Iterator[ServerProcess]:
    with start_server(serve_args(server_store)) as running:
        yield running


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settled_cpu_seconds(pid: int, within: float = 240.0) -> float:
    """The CPU time of process ``pid`` once it stops growing (its work is over)."""
    deadline = time.monotonic() + within
    last = cpu_seconds(pid)
    while True:
        time.sleep(0.5)
        now = cpu_seconds(pid)
        if now - last < 0.05:
            return now
        assert time.monotonic() < deadline, "the server never stopped computing"
        last = now


def test_a_timeout_stops_encoding_a_large_free_answer(server):
    pid = server.process.pid
    with psycopg.connect(server.dsn("alice"), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM released.adult_syn").fetchone() == (200,)
        conn.execute("SET statement_timeout = '2s'")
        started = settled_cpu_seconds(pid)
        with pytest.raises(psycopg.errors.QueryCanceled,
                           match=r"^canceling statement due to statement timeout$"):
            conn.execute(LARGE)
        answered = cpu_seconds(pid)
        settled = settled_cpu_seconds(pid)
        # Before the fix the encoding went on to the end: many times the work before.
        assert settled - answered < answered - started
        assert conn.execute("SELECT count(*) FROM released.adult_syn").fetchone() == (200,)
