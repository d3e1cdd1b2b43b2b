"""The Interrupter stops one statement's DuckDB queries, and never the next statement's."""

from __future__ import annotations

import contextlib
import threading
import time

import duckdb
import pytest

from dpsql.errors import QueryCanceled
from dpsql.interrupt import Interrupter

LONG = "SELECT count(*) FROM range(2000) a, range(2000) b, range(2000) c"  # 8e9 rows: minutes
SHORT = "SELECT sum(a.range * b.range) FROM range(3000) a, range(3000) b"  # 9e6 rows


@pytest.fixture
def cursor():
    connection = duckdb.connect()
    yield connection.cursor()
    connection.close()


def _run(interrupts: Interrupter, cursor: duckdb.DuckDBPyConnection, text: str) -> object:
    with interrupts.running(cursor):
        return cursor.sql(text).fetchall()


@pytest.mark.timeout(60)
def test_a_running_query_stops_and_the_statement_refuses_more(cursor):
    interrupts = Interrupter()
    with interrupts.statement():
        threading.Timer(0.2, interrupts.interrupt).start()
        started = time.monotonic()
        with pytest.raises(QueryCanceled):
            _run(interrupts, cursor, LONG)
        assert time.monotonic() - started < 2
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
