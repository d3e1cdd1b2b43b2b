"""The Interrupter stops one statement's DuckDB queries, and never the next statement's."""

from __future__ import annotations

import contextlib
import threading
import time

import duckdb
import pytest

from dpsql.engines.interrupt import Interrupter
from dpsql.errors import QueryCanceled

# 1.6e13 rows: weeks, so only an interrupt ends it
ENDLESS = "SELECT count(*) FROM range(2000) a, range(2000) b, range(2000) c, range(2000) d"
SHORT = "SELECT sum(a.range * b.range) FROM range(3000) a, range(3000) b"  # 9e6 rows


@pytest.fixture
def cursor():
    connection = duckdb.connect()
    yield connection.cursor()
    connection.close()


def _run(interrupts: Interrupter, cursor: duckdb.DuckDBPyConnection, text: str,
         started: threading.Event | None = None) -> object:
    with interrupts.running(cursor):
        if started is not None:
            started.set()
        return cursor.sql(text).fetchall()


@pytest.mark.timeout(60)  # only the interrupt ends ENDLESS: a hang guard
def test_a_running_query_stops_and_the_statement_refuses_more(cursor):
    interrupts, started = Interrupter(), threading.Event()
    with interrupts.statement():
        # Interrupted once it runs: DuckDB forgets an interrupt that comes just before a
        # query starts, and the Interrupter repeats it until the query has ended.
        threading.Thread(target=lambda: started.wait() and interrupts.interrupt(),
                         daemon=True).start()
        with pytest.raises(QueryCanceled):
            _run(interrupts, cursor, ENDLESS, started)
        with pytest.raises(QueryCanceled):  # a query this statement has not started yet
            _run(interrupts, cursor, "SELECT 1")


def test_an_interrupt_outside_a_statement_does_nothing(cursor):
    interrupts = Interrupter()
    interrupts.interrupt()
    with interrupts.statement():
        assert _run(interrupts, cursor, "SELECT 1") == [(1,)]


@pytest.mark.timeout(60)
def test_the_next_statement_on_the_same_cursor_is_not_hit(cursor):
    interrupts = Interrupter()
    for _ in range(20):  # an interrupt racing with the end of the statement it stops
        with interrupts.statement():
            threading.Timer(0.005, interrupts.interrupt).start()
            with contextlib.suppress(QueryCanceled):
                _run(interrupts, cursor, SHORT)
        time.sleep(0.01)
        with interrupts.statement():
            assert _run(interrupts, cursor, SHORT)[0][0] > 0


def test_check_raises_only_in_the_interrupted_statement():
    """Python work between a statement's queries (encoding its answer) asks check()."""
    interrupts = Interrupter()
    interrupts.check()  # no statement: nothing to stop
    with interrupts.statement():
        interrupts.check()
        interrupts.interrupt()
        with pytest.raises(QueryCanceled):
            interrupts.check()
    interrupts.check()
    with interrupts.statement():
        interrupts.check()  # the next statement is not hit
