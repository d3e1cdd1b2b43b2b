"""Statement timeouts and cancel requests stop the DuckDB work of free and DP queries alike."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dpsql import passwords
from dpsql.services import open_store

from ..conftest import ENDLESS_FREE, SLOW_DP, slow_store
from . import rawclient as raw
from .conftest import ServerProcess, cancelling, serve_args, start_server

PASSWORD = "slow-secret-1"
# Only an interrupt ends ENDLESS_FREE, and a statement waits for the work of the one
# stopped before it: a broken interrupt hangs, and this guard fails the test.
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with two worker threads over the slow store."""
    path = slow_store(tmp_path_factory.mktemp("slow") / "slow.duckdb")
    with open_store(path) as store:
        for user in ("alice", "bob", "carol"):
            passwords.set_password(store, user, PASSWORD)
    with start_server(serve_args(Path(path), "--workers", "2")) as running:
        yield running


def _connect(server: ServerProcess, user: str) -> psycopg.Connection:
    return psycopg.connect(server.dsn(user, PASSWORD), autocommit=True)


def _spent(conn: psycopg.Connection) -> float:
    return conn.execute("SELECT * FROM dpsql_budget()").fetchone()[3]


@pytest.mark.parametrize("stop", ["statement timeout", "user request"])
def test_timeout_and_cancel_stop_free_and_dp_queries(server, stop):
    with _connect(server, "alice") as conn, _connect(server, "alice") as watcher:
        conn.execute("SELECT count(*) FROM released.r")  # the first statements load code
        notices: list[str] = []
        conn.add_notice_handler(lambda notice: notices.append(notice.message_primary or ""))
        for text, cost in ((ENDLESS_FREE, 0.0), (SLOW_DP, 0.1)):
            before = _spent(conn)
            # A DP query is charged before its DuckDB work starts: cancel it once charged.
            charged = (lambda b=before, c=cost: _spent(watcher) > b + c / 2) if cost \
                else (lambda: True)
            stopping = cancelling(conn, charged) if stop == "user request" \
                else contextlib.nullcontext()
            if stop == "statement timeout":
                conn.execute("SET statement_timeout = '300ms'")
            with stopping, pytest.raises(psycopg.errors.QueryCanceled,
                                         match=f"^canceling statement due to {stop}$"):
                conn.execute(text)
            # The next statement waits for the stopped one's work to end: it has ended,
            # though ENDLESS_FREE only ends when interrupted.
            conn.execute("SET statement_timeout = 0")
            assert _spent(conn) == pytest.approx(before + cost)  # a DP query's charge stands
        # SLOW_DP (seconds) was stopped too, not run to its end: its answer was never
        # stored, so asking it again would be charged, not answered from the cache.
        notices.clear()
        conn.execute("EXPLAIN PRIVACY " + SLOW_DP)
        [notice] = [n for n in notices if "this query would cost" in n]
        assert "would cost epsilon=" in notice, notice
        assert "from the cache" not in notice


def test_two_stuck_clients_do_not_freeze_a_third(server):
    """With --workers 2, two clients running endless queries hold both workers until their
    statement timeout interrupts them; a third client is served after."""
    stuck = []
    for user in ("alice", "bob"):
        client = raw.RawClient(server.port, timeout=120)
        assert client.login(user, PASSWORD)[-1].kind == b"Z"
        client.send(raw.query("SET statement_timeout = '1s'"))
        assert client.read_until()[-1].kind == b"Z"
        stuck.append(client)
    for client in stuck:  # sent before carol connects: the server takes them first
        client.send(raw.query(ENDLESS_FREE))
    with _connect(server, "carol") as conn:  # served only once an interrupt frees a worker
        assert conn.execute("SELECT count(*) FROM released.r").fetchone() == (200,)
    for client in stuck:
        with client:
            error = client.read_until()[0]
            assert (error.kind, error.fields()["C"]) == (b"E", "57014")
            assert error.fields()["M"] == "canceling statement due to statement timeout"
