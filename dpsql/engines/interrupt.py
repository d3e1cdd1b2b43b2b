"""Stopping one statement's DuckDB queries from another thread (statement timeout, cancel).

DuckDB stops a query when its connection's ``interrupt()`` is called while it
runs, and forgets an interrupt that arrives just before a query starts. So an
:class:`Interrupter` knows which cursors the current statement runs queries on,
refuses new queries once the statement is interrupted, and repeats the
interrupt until the queries it targeted are over. Queries of a later
statement, even on the same cursor, are never hit. Python work of the
statement that runs long after its queries (encoding millions of answer rows)
asks :meth:`Interrupter.check` between pieces.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import duckdb

from dpsql.errors import QueryCanceled

REPEAT_EVERY = 0.02  # seconds between repeated interrupts of a query that goes on


class Interruptible(Protocol):
    """What runs a query: a DuckDB cursor, or another engine's cancel handle."""

    def interrupt(self) -> None:
        """Stop the query running now, if any."""


class Interrupter:
    """The interruptible DuckDB work of one statement at a time (one per session)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0  # statements nest: the server's work around the session's
        self._interrupted = False
        self._running: dict[int, Interruptible] = {}
        self._ids = itertools.count()

    @contextmanager
    def statement(self) -> Iterator[None]:
        """Mark a statement: :meth:`interrupt` acts only while one runs."""
        with self._lock:
            if self._depth == 0:
                self._interrupted = False
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1

    @contextmanager
    def running(self, cursor: Interruptible) -> Iterator[None]:
        """Run a query of the current statement on ``cursor``; an interrupt raises QueryCanceled."""
        with self._lock:
            if self._interrupted:
                raise QueryCanceled()
            key = next(self._ids)
            self._running[key] = cursor
        try:
            yield
        except duckdb.InterruptException:
            raise QueryCanceled() from None
        finally:
            with self._lock:
                del self._running[key]

    def check(self) -> None:
        """Raise QueryCanceled if the current statement was interrupted.

        For the statement's long Python work outside DuckDB (encoding a large
        answer for the wire), which no DuckDB interrupt reaches: call it between pieces.
        """
        with self._lock:
            if self._depth and self._interrupted:
                raise QueryCanceled()

    def interrupt(self) -> None:
        """Stop the current statement's queries and refuse its next ones (any thread)."""
        with self._lock:
            if self._depth == 0:
                return
            self._interrupted = True
            targets = set(self._running)
        if targets:
            threading.Thread(target=self._repeat, args=(targets,), daemon=True,
                             name="dpsql-interrupt").start()

    def _repeat(self, targets: set[int]) -> None:
        while True:
            with self._lock:  # a target still listed has not ended: its cursor is not reused
                cursors = [self._running[key] for key in targets if key in self._running]
                for cursor in cursors:
                    cursor.interrupt()
            if not cursors:
                return
            time.sleep(REPEAT_EVERY)
