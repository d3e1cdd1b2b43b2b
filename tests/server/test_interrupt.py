"""Statement timeouts and cancel requests stop the DuckDB work of free and DP queries alike."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dpsql.server import auth
from dpsql.store import Store

from ..conftest import SLOW_DP, SLOW_FREE, slow_store
from .conftest import ServerProcess, serve_args, start_server

PASSWORD = "slow-secret-1"
# Without interrupts these queries run for minutes: fail in bounded time instead.
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with two worker threads over the slow store."""
    path = slow_store(tmp_path_factory.mktemp("slow") / "slow.duckdb")
    with Store.open(path) as store:
        for user in ("alice", "bob", "carol"):
            auth.set_password(store, user, PASSWORD)
    with start_server(serve_args(Path(path), "--workers", "2")) as running:
        yield running


def _connect(server: ServerProcess, user: str) -> psycopg.Connection:
    return psycopg.connect(server.dsn(user, PASSWORD), autocommit=True)


def _spent(conn: psycopg.Connection) -> float:
    return conn.execute("SELECT * FROM dpsql_budget()").fetchone()[3]


@pytest.mark.parametrize("stop", ["statement timeout", "user request"])
def test_timeout_and_cancel_stop_free_and_dp_queries(server, stop):
    with _connect(server, "alice") as conn:
        conn.execute("SELECT count(*) FROM released.r")  # the first statements load code
        _spent(conn)
        if stop == "statement timeout":
            conn.execute("SET statement_timeout = '300ms'")
        for text, cost in ((SLOW_FREE, 0.0), (SLOW_DP, 0.1)):
            before = _spent(conn)
            timer = threading.Timer(0.3, conn.cancel)
            if stop == "user request":
                timer.start()
            started = time.monotonic()
            with pytest.raises(psycopg.errors.QueryCanceled,
                               match=f"^canceling statement due to {stop}$"):
                conn.execute(text)
            # The next statement waits for the stopped one's work to end: it has.
            after = _spent(conn)
            assert time.monotonic() - started < 3
            assert after == pytest.approx(before + cost)  # a DP query's charge stands


def test_two_stuck_clients_do_not_freeze_a_third(server):
    """With --workers 2, two clients running endless queries hold both workers until their
    statement timeout interrupts them; a third client is served right after."""
    errors: list[BaseException] = []

    def stuck(user: str) -> None:
        with _connect(server, user) as conn:
            conn.execute("SET statement_timeout = '1s'")
            try:
                conn.execute(SLOW_FREE)
            except psycopg.errors.QueryCanceled as err:
                errors.append(err)

    clients = [threading.Thread(target=stuck, args=(user,)) for user in ("alice", "bob")]
    for client in clients:
        client.start()
    time.sleep(0.5)
    started = time.monotonic()
    with _connect(server, "carol") as conn:
        assert conn.execute("SELECT count(*) FROM released.r").fetchone() == (200,)
    assert time.monotonic() - started < 4
    for client in clients:
        client.join(timeout=60)
    assert len(errors) == 2
