"""The isolated database that answers free queries: released and public tables, nothing else.

Queries over ``released.*`` tables, and queries that read no table at all, are
post-processing of DP output and cost nothing. They never run on the store's
connection, nor in the process that holds it. They run on a separate DuckDB
instance, a read-only file in a private temporary folder, opened by a sandbox
process (:mod:`dpsql.sandbox`: a fresh interpreter with a hard address-space
limit). It holds copies of the released tables, the policy's public tables
(``public_tables.<name>``) and the public ``udfs`` macros. It has no sensitive
table, no ``dpsql.*`` table, no secret and no credential. Whatever DuckDB
function an analyst reaches there, today's or a future one, there is no
private data for it to read, and whatever memory it takes is the sandbox's: a
query that needs more fails with OutOfMemory, and the server goes on. The
validation in :mod:`dpsql.query.released` stays as a second layer.

The copy is made by dpsql's own fixed SQL on the store, in one snapshot, and
written by this process. It is rebuilt when the released tables change: a
release, ``release-more`` or a replacement. Each free query first compares a
signature of the store's released tables with the copy's. A release commits its
table and provenance in one transaction on the store, so the copy shows a
release whole or not at all. A new copy is a new file: sandboxes open it on
their next query, and an old file is removed once no query that chose it is
still on its way to a sandbox (one that opened it keeps reading it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from dpsql.domain import quote
from dpsql.engines.interrupt import Interrupter
from dpsql.provenance import live_versions
from dpsql.public import SCHEMA as PUBLIC_SCHEMA
from dpsql.query.released import free_name
from dpsql.sandbox import Database, Sandboxes
from dpsql.sandboxed import open_file
from dpsql.sizes import mib
from dpsql.store import HARDENED_CONFIG, Store, StoreKey, install_udfs

SCHEMA = "released"


def _quarter_of_memory() -> str:
    """A quarter of the machine's memory, as DuckDB reads a size (it takes no percentage)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf on this platform
        return "4GiB"
    return f"{max(total // 4 // 2**20, 256)}MiB"


#: On top of the store's hardening: no Python object can be scanned by name, so
#: no variable of a calling frame is reachable from analyst SQL; and a query that
#: tries to use the whole machine (a many-way self-join) hits a memory and spill
#: limit instead. In a sandbox, ``memory_limit`` is half its address-space limit
#: (:func:`_sandbox_config`): DuckDB does not count everything against it.
FREE_CONFIG = {**HARDENED_CONFIG, "python_enable_replacements": False,
               "memory_limit": _quarter_of_memory(), "max_temp_directory_size": "4GB"}

#: Schemas copied: released tables, and the policy's public tables (:mod:`dpsql.public`).
SCHEMAS = (SCHEMA, PUBLIC_SCHEMA)
_TABLES = (
    "SELECT schema_name, table_name, table_oid, column_count, estimated_size "
    "FROM duckdb_tables() WHERE database_name = current_database() "
    f"AND schema_name IN ('{SCHEMA}', '{PUBLIC_SCHEMA}') ORDER BY schema_name, table_name")
_KEYS = itertools.count(1)


def _sandbox_config(sandboxes: Sandboxes) -> dict[str, Any]:
    """The copy's configuration in a sandbox: spills go to the sandbox's own folder."""
    return {**FREE_CONFIG, "memory_limit": mib(sandboxes.memory // 2), "temp_directory": "spill"}


@dataclass
class _Copy:
    """One built copy: its file, the signature it was built from, and the queries using it."""

    version: int
    path: Path
    signature: tuple[tuple[object, ...], ...]
    names: frozenset[str]
    users: int = 0


@dataclass(frozen=True)
class FreeCopy:
    """The copy a free query runs on: the table names it holds (free_name), and :meth:`run`."""

    names: frozenset[str]
    version: int
    path: Path
    key: str
    sandboxes: Sandboxes

    def run(self, sql: str, *, user: str, interrupts: Interrupter | None = None) -> pa.Table:
        """``sql``'s answer on this copy, in a sandbox.

        Raises the ``duckdb.Error`` the query raised, OutOfMemory, or
        QueryCanceled (an interrupt through ``interrupts``).
        """
        database = Database(self.key, self.version, open_file,
                            (str(self.path), _sandbox_config(self.sandboxes)))
        return self.sandboxes.run(database, sql, user=user, interrupts=interrupts)


class FreeDatabase:
    """A store's isolated database for free queries (one per open store).

    A store service (``store[FREE]``), whose queries run in the store's
    ``sandboxes``; it closes with the store.
    """

    def __init__(self, sandboxes: Sandboxes) -> None:
        self._sandboxes = sandboxes
        self._lock = threading.Lock()  # one rebuild at a time; readers take the current copy
        self._folder: Path | None = None  # made with the first copy
        self._copy: _Copy | None = None
        self._builds = 0
        self._key = f"free-{next(_KEYS)}"

    @contextmanager
    def using(self, store: Store) -> Iterator[FreeCopy]:
        """The copy matching ``store`` now; its file stays while the block runs."""
        copy = self._current(store)
        try:
            yield FreeCopy(copy.names, copy.version, copy.path, self._key, self._sandboxes)
        finally:
            with self._lock:
                copy.users -= 1
                if copy is not self._copy and copy.users == 0:
                    _remove(copy)

    def _current(self, store: Store) -> _Copy:
        with self._lock, _snapshot(store) as source:
            signature = _signature(source)
            if self._copy is None or self._copy.signature != signature:
                old, self._copy = self._copy, self._build(source, signature)
                if old is not None and old.users == 0:
                    _remove(old)
            self._copy.users += 1
            return self._copy

    def _build(self, source: duckdb.DuckDBPyConnection,
               signature: tuple[tuple[object, ...], ...]) -> _Copy:
        """Write the released and public tables of ``source`` into a new file."""
        self._builds += 1
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="dpsql-free-"))
        path = self._folder / f"free-{self._builds}.duckdb"
        tables = [(str(row[0]), str(row[1])) for row in signature]
        writer = duckdb.connect(str(path), config=dict(FREE_CONFIG))
        try:
            for schema in SCHEMAS:
                writer.execute(f"CREATE SCHEMA {schema}")
            install_udfs(writer)
            for schema, name in tables:
                table = f"{schema}.{quote(name)}"
                data = source.sql(f"SELECT * FROM {table}").to_arrow_table()
                writer.register("_dpsql_copy", data)
                writer.execute(f"CREATE TABLE {table} AS SELECT * FROM _dpsql_copy")
                writer.unregister("_dpsql_copy")
        finally:
            writer.close()
        return _Copy(self._builds, path, signature,
                     frozenset(free_name(schema, name) for schema, name in tables))

    def close(self) -> None:
        """Forget the copy and remove its folder (the store closes its sandboxes)."""
        with self._lock:
            self._copy = None
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)


#: FreeDatabase of each open store: ``store[FREE]``.
FREE: StoreKey[FreeDatabase] = StoreKey("free")


def _signature(source: duckdb.DuckDBPyConnection) -> tuple[tuple[object, ...], ...]:
    """Each copied table's identity, and a released one's live provenance, in one snapshot."""
    live = live_versions(source)
    return tuple((*row, *(live.get(str(row[1]), (None, None)) if row[0] == SCHEMA
                          else (None, None)))
                 for row in source.execute(_TABLES).fetchall())


def _remove(copy: _Copy) -> None:
    """Remove an old copy's files (a sandbox that opened it keeps reading it)."""
    for stale in copy.path.parent.glob(f"{copy.path.name}*"):
        with contextlib.suppress(OSError):
            stale.unlink()


@contextmanager
def _snapshot(store: Store) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor on the store inside a read-only transaction (one consistent snapshot)."""
    cursor = store.cursor()
    cursor.execute("BEGIN TRANSACTION")
    try:
        yield cursor
    finally:
        with contextlib.suppress(duckdb.Error):
            cursor.execute("ROLLBACK")
        cursor.close()
