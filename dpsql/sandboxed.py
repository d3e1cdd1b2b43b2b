"""What runs inside a sandbox process (:mod:`dpsql.sandbox`): it answers its owner's queries.

Imported by the sandbox only, after its address-space limit is set. It reads
requests (pickled by its owner, whom it trusts) and answers with bytes: ``R``
then an Arrow IPC stream, or ``E`` and JSON (the error's kind and DuckDB's
message). One query runs at a time, on a thread of its own; the main thread
reads the pipe, so that an interrupt reaches the running query, and ends the
process when the pipe closes (the owner closed it, or died), after removing
its own folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

SESSIONS_KEPT = 64  # cursors kept for catalog connections (the least recently used go)


def open_file(path: str, config: dict[str, Any]) -> duckdb.DuckDBPyConnection:
    """A database file, read-only (a :class:`dpsql.sandbox.Database` opener)."""
    return duckdb.connect(path, read_only=True, config=config)


def serve(conn: Connection) -> None:
    """Answer queries until the owner closes the pipe or dies."""
    host = _Host(conn)
    threading.Thread(target=host.work, daemon=True, name="dpsql-sandbox-query").start()
    conn.send_bytes(b"ready")
    try:
        while True:
            message = conn.recv()
            if message[0] == "run":
                host.jobs.put(message)
            elif message[0] == "interrupt":
                host.interrupt(message[1])
    except BaseException:  # EOF: the owner closed the pipe or died; anything else: unusable
        _remove_own_folder()
        os._exit(0)


def _remove_own_folder() -> None:
    """Remove this sandbox's folder (its spill files too): an owner that died cannot."""
    here = Path.cwd()
    if here.name.startswith("sandbox-") and here.parent.name.startswith("dpsql-sandbox-"):
        shutil.rmtree(here, ignore_errors=True)


class _Host:
    """The sandbox's databases, its kept cursors, and the query running now."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.jobs: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: tuple[int, duckdb.DuckDBPyConnection] | None = None
        self._databases: dict[str, tuple[int, duckdb.DuckDBPyConnection]] = {}
        self._sessions: OrderedDict[tuple[str, object],
                                    tuple[int, duckdb.DuckDBPyConnection, dict[str, Any]]] = \
            OrderedDict()

    def interrupt(self, seq: int) -> None:
        with self._lock:
            if self._running is not None and self._running[0] == seq:
                self._running[1].interrupt()

    def work(self) -> None:
        try:
            while True:
                _, seq, spec, setup, sql, most = self.jobs.get()
                try:
                    head, payload = b"R", self._run(seq, spec, setup, sql, most)
                except BaseException as err:  # every failure is an answer
                    head, payload = _failure(err), None
                self.conn.send_bytes(head)
                if payload is not None:
                    self.conn.send_bytes(payload)
                del payload
        except BaseException:  # a sandbox that cannot answer ends; its owner answers for it
            os._exit(1)

    def _run(self, seq: int, spec: tuple[Any, ...], setup: tuple[Any, ...] | None, sql: str,
             most: int) -> pa.Buffer:
        key, version, opener, args = spec
        con = self._database(key, version, opener, args)
        cursor = self._session(key, version, con, setup) if setup is not None else con.cursor()
        try:
            with self._lock:
                self._running = (seq, cursor)
            try:
                relation = cursor.sql(sql)
                table = relation.to_arrow_table() if relation is not None else pa.table({})
            finally:
                with self._lock:
                    self._running = None
        finally:
            if setup is None:
                cursor.close()
        if table.nbytes > most:
            raise _TooLarge()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        del table
        buffer = sink.getvalue()
        if buffer.size > most:
            raise _TooLarge()
        return buffer

    def _database(self, key: str, version: int, opener: Callable[..., duckdb.DuckDBPyConnection]
                  | None, args: tuple[Any, ...]) -> duckdb.DuckDBPyConnection:
        held = self._databases.get(key)
        if held is not None and held[0] == version:
            return held[1]
        if opener is None:
            raise RuntimeError(f"database {key} version {version} was never sent")
        if held is not None:  # an older version: its kept cursors go with it
            for name in [name for name in self._sessions if name[0] == key]:
                del self._sessions[name]
            with contextlib.suppress(duckdb.Error):
                held[1].close()
            del self._databases[key]
        con = opener(*args)
        self._databases[key] = (version, con)
        return con

    def _session(self, key: str, version: int, con: duckdb.DuckDBPyConnection,
                 setup: tuple[Any, ...]) -> duckdb.DuckDBPyConnection:
        ident, prepare, args = setup
        name = (key, ident)
        kept = self._sessions.pop(name, None)
        if kept is None or kept[0] != version:
            kept = (version, con.cursor(), {})
        prepare(kept[1], kept[2], *args)  # a failure drops the cursor
        self._sessions[name] = kept
        while len(self._sessions) > SESSIONS_KEPT:
            _, (_, old, _) = self._sessions.popitem(last=False)
            old.close()
        return kept[1]


class _TooLarge(Exception):
    """The answer is larger than the owner takes."""


def _failure(err: BaseException) -> bytes:
    """An error as the owner reads it: JSON after ``E``, its kind and DuckDB's message."""
    # After an allocation failed, DuckDB may keep address space it cannot use again:
    # the owner replaces a sandbox that ran out of memory.
    retire = isinstance(err, (duckdb.OutOfMemoryException, MemoryError))
    if retire:
        kind, message = "OutOfMemory", str(err).splitlines()[0] if str(err) else ""
    elif isinstance(err, _TooLarge):
        kind, message = "TooLarge", ""
    elif isinstance(err, duckdb.Error):
        kind, message = type(err).__name__, str(err)
    else:
        kind, message = type(err).__name__, str(err).splitlines()[0] if str(err) else ""
    return b"E" + json.dumps({"kind": kind, "message": message[:4000],
                              "retire": retire}).encode()

