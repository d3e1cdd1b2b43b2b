"""The isolated database that answers free queries: released and public tables, nothing else.

Queries over ``released.*`` tables, and queries that read no table at all, are
post-processing of DP output and cost nothing. They never run on the store's
connection. They run on a separate DuckDB instance, a read-only file in a
private temporary folder. It holds copies of the released tables, the
policy's public tables (``public_tables.<name>``) and the public ``udfs``
macros. It has no sensitive table, no ``dpsql.*`` table, no secret and no
credential. Whatever DuckDB function an analyst reaches there,
today's or a future one, there is no private data for it to read. The
validation in :mod:`dpsql.query.released` stays as a second layer.

The copy is made by dpsql's own fixed SQL on the store, in one snapshot. It
is rebuilt when the released tables change: a release, ``release-more`` or a
replacement. Each free query first compares a signature of the store's
released tables with the copy's. A release commits its table and provenance
in one transaction on the store, so the copy shows a release whole or not at
all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb

from dpsql.domain import quote
from dpsql.public import SCHEMA as PUBLIC_SCHEMA
from dpsql.query.released import free_name
from dpsql.store import HARDENED_CONFIG, Store, install_udfs

SCHEMA = "released"

#: On top of the store's hardening: no Python object can be scanned by name, so
#: no variable of a calling frame is reachable from analyst SQL; and a free query
#: that tries to use the whole machine (a many-way self-join) hits a memory and
#: spill limit instead (the server's statement timeout bounds its time).
def _quarter_of_memory() -> str:
    """A quarter of the machine's memory, as DuckDB reads a size (it takes no percentage)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf on this platform
        return "4GiB"
    return f"{max(total // 4 // 2**20, 256)}MiB"


FREE_CONFIG = {**HARDENED_CONFIG, "python_enable_replacements": False,
               "memory_limit": _quarter_of_memory(), "max_temp_directory_size": "4GB"}

#: Schemas copied: released tables, and the policy's public tables (:mod:`dpsql.public`).
SCHEMAS = (SCHEMA, PUBLIC_SCHEMA)
_SIGNATURE = (
    "SELECT t.schema_name, t.table_name, t.table_oid, t.column_count, t.estimated_size, "
    "r.release_id, md5(r.record) "
    "FROM duckdb_tables() t LEFT JOIN dpsql.releases r ON t.schema_name = 'released' "
    "AND r.name = t.table_name AND r.superseded_by IS NULL "
    "WHERE t.database_name = current_database() "
    f"AND t.schema_name IN ('{SCHEMA}', '{PUBLIC_SCHEMA}') "
    "ORDER BY t.schema_name, t.table_name")


@dataclass(frozen=True)
class _Copy:
    """One built copy: its read-only connection and the signature it was built from."""

    signature: tuple[tuple[object, ...], ...]
    connection: duckdb.DuckDBPyConnection
    names: frozenset[str]


class FreeDatabase:
    """A store's isolated database for free queries (one per open store).

    Get it with ``store.state(FreeDatabase)``; :meth:`Store.close` closes it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one rebuild at a time; readers take the current copy
        self._folder = Path(tempfile.mkdtemp(prefix="dpsql-free-"))
        self._copy: _Copy | None = None
        self._builds = 0

    @contextmanager
    def cursor(self, store: Store) -> Iterator[tuple[duckdb.DuckDBPyConnection, frozenset[str]]]:
        """A cursor on the copy matching ``store`` now, and the table names it holds (free_name)."""
        copy = self._current(store)
        cursor = copy.connection.cursor()
        try:
            yield cursor, copy.names
        finally:
            cursor.close()

    def _current(self, store: Store) -> _Copy:
        with self._lock, _snapshot(store) as source:
            signature = tuple(tuple(row) for row in source.execute(_SIGNATURE).fetchall())
            if self._copy is None or self._copy.signature != signature:
                self._copy = self._build(source, signature)
            return self._copy

    def _build(self, source: duckdb.DuckDBPyConnection,
               signature: tuple[tuple[object, ...], ...]) -> _Copy:
        """Write the released tables of ``source`` into a new file, then open it read-only.

        An older copy stays open for the queries still running on it; its file
        is removed now (the open instance keeps reading the unlinked file).
        """
        self._builds += 1
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
        connection = duckdb.connect(str(path), read_only=True, config=dict(FREE_CONFIG))
        if self._copy is not None:
            self._forget(self._copy)
        return _Copy(signature, connection, frozenset(free_name(schema, name)
                                                      for schema, name in tables))

    def _forget(self, copy: _Copy) -> None:
        with contextlib.suppress(duckdb.Error):
            copy.connection.close()  # running cursors keep their instance alive
        for stale in self._folder.glob("free-*.duckdb*"):
            if stale.name != f"free-{self._builds}.duckdb":
                stale.unlink(missing_ok=True)

    def close(self) -> None:
        """Close the copy and remove its folder."""
        with self._lock:
            if self._copy is not None:
                with contextlib.suppress(duckdb.Error):
                    self._copy.connection.close()
                self._copy = None
            shutil.rmtree(self._folder, ignore_errors=True)


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
