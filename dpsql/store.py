"""The governed store: one DuckDB file, its connection, transactions and migration runner.

Nothing more: each other ``dpsql`` table has one owning module, its only writer,
which declares its migrations and crash recovery in a :class:`Tables`
(:data:`dpsql.services.OWNERS`, in their global order). This module owns
``dpsql.meta`` (schema version, secret). Connections are hardened (no files,
URLs, ATTACH or extensions; configuration locked); DuckDB's file lock keeps a
second process out; within a process there is one :class:`Store` per file, and
every write transaction holds its write lock (:meth:`Store.transaction`).

The modules above keep one object each per open store (their caches, the
ledger's books, the jobs), each under a typed :class:`StoreKey` they declare:
``store[BOOKS]``. :func:`dpsql.services.open_store` builds them all at open; the
store closes them, last built first, when it closes.
"""

from __future__ import annotations

import errno
import re
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Generic, TypeVar

import duckdb

from dpsql.errors import ConfigurationError, InternalError, StoreError
from dpsql.files import make_store_private, private_umask

T = TypeVar("T")

#: A ``duckdb.connect`` configuration (its stubs' type: a dict, invariant in its values).
DuckDBConfig = dict[str, str | bool | int | float | list[str]]

HARDENED_CONFIG: DuckDBConfig = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "lock_configuration": True,
}

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_open_stores: dict[tuple[int, int] | None, Store] = {}  # by (device, inode): links share one
_open_lock = threading.Lock()  # guards _open_stores: one Store per file in the process


@dataclass(frozen=True)
class Tables:
    """One module's tables: their migrations, and their crash recovery at open.

    ``migrations``: schema version -> statements (never edit a released one).
    ``recover(store, cur)`` closes what a process that ended left open in them.
    """

    owner: str
    migrations: Mapping[int, Sequence[str]]
    recover: Callable[[Store, duckdb.DuckDBPyConnection], None] | None = field(default=None)


#: The store's own table (version 1 created the schemas with it).
TABLES = Tables("store", {1: (
    "CREATE SCHEMA IF NOT EXISTS dpsql",
    "CREATE SCHEMA IF NOT EXISTS released",
    "CREATE TABLE dpsql.meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
)})


def now() -> datetime:
    """The current time, timezone-aware (stored as TIMESTAMP)."""
    return datetime.now(timezone.utc)


def check_identifier(name: str, what: str = "name") -> str:
    """Accept only plain SQL identifiers for names dpsql will put into SQL."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ConfigurationError(f"{what} {name!r} is not a valid identifier; use letters, "
                                 "digits and _ (not starting with a digit)")
    return name


def schema_version(owners: Sequence[Tables]) -> int:
    """The version ``owners`` bring a store to; every version from 1 must have a migration."""
    versions = {v for owner in owners for v in owner.migrations}
    latest = max(versions, default=0)
    if versions != set(range(1, latest + 1)) or owners[0] is not TABLES:
        raise InternalError("the store's owners skip a schema version or do not start with "
                            "the store's own tables; this is a bug in dpsql")
    return latest


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, or None when there is none."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


class StoreKey(Generic[T]):
    """The typed key of one per-store object, declared beside its class by its owner.

    ``store[key]`` is then of that class for the type checker too (as aiohttp's
    ``AppKey``), without the store importing the modules above it.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<StoreKey {self.name}>"


#: Builds the per-store objects of a store just opened, each under its key, in order.
Services = Callable[["Store"], Sequence[tuple[StoreKey[Any], Any]]]


class Store:
    """An open governed DuckDB file (one instance per file): see :func:`dpsql.services.open_store`.

    ``store[key]``: the per-store object of a module above (see :class:`StoreKey`).
    """

    def __init__(self, path: Path, connection: duckdb.DuckDBPyConnection) -> None:
        self.path = path
        self._con = connection
        self._users = 1
        self._key: tuple[int, int] | None = None  # (device, inode) of the file, once open
        # Held by every write transaction: they read, check, then write (budgets, ids,
        # policy versions), and DuckDB would abort a second concurrent writer of a row.
        self.lock = threading.RLock()
        self._services: dict[StoreKey[Any], Any] = {}

    def __getitem__(self, key: StoreKey[T]) -> T:
        """This store's object under ``key`` (built at open)."""
        found: T = self._services[key]
        return found

    @classmethod
    def open(cls, path: str | Path, owners: Sequence[Tables],
             services: Services, *, create: bool = False,
             limits: Mapping[str, str | int] | None = None) -> Store:
        """Open (or ``create``) the store at ``path``: one instance per file (device, inode).

        ``owners``' migrations run in one global order, then their recoveries, then
        ``services(store)`` builds the per-store objects. ``limits`` (DuckDB settings)
        apply to a new connection only. A link to an open file shares its instance:
        two DuckDB instances on one file would each keep their own charges.
        """
        resolved = Path(path).expanduser().resolve()
        private_umask()  # the store and the WAL DuckDB re-creates at each checkpoint: 0600
        with _open_lock:
            key = _file_identity(resolved)
            if key is not None and create:
                raise StoreError(f"{path} already exists; open it instead, or choose a new path")
            if key is None and not create:
                raise StoreError(f"no store at {path}; create one with: dpsql init {path} "
                                 "--policy POLICY.yaml")
            existing = _open_stores.get(key) if key is not None else None
            if existing is not None:
                existing._users += 1
                return existing
            if key is not None:
                make_store_private(resolved)
            store = cls(resolved, _connect(resolved, limits))
            try:
                store._migrate(owners, create)
                with store.transaction() as cur:
                    for owner in owners:
                        if owner.recover is not None:
                            owner.recover(store, cur)
                    install_udfs(cur)
                store._key = _file_identity(resolved)
                if store._key is None:
                    raise StoreError(f"{path} disappeared while it was opened; try again")
                store._services = dict(services(store))
            except BaseException:
                store._con.close()
                raise
            _open_stores[store._key] = store
            return store

    def close(self) -> None:
        """Release this handle; the file closes when the last handle in the process does."""
        with _open_lock:
            self._users -= 1
            if self._users > 0:
                return
            _open_stores.pop(self._key, None)
            try:
                self._close_services()
            finally:
                self._con.close()

    def _close_services(self) -> None:
        """Close each per-store object that has a ``close``, last built first.

        Each is closed even when one before it raised (the first error is raised):
        the jobs settle before the ledger's queued settles close, the free
        database before its sandboxes.
        """
        error: BaseException | None = None
        for service in reversed(list(self._services.values())):
            close = getattr(service, "close", None)
            if close is None:
                continue
            try:
                close()
            except BaseException as err:  # the others still close
                error = error or err
        if error is not None:
            raise error

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self, owners: Sequence[Tables], create: bool) -> None:
        """Bring the file to the owners' version, one version per transaction."""
        latest, version = schema_version(owners), 0
        if self._con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'dpsql' "
                             "AND table_name = 'meta'").fetchone() != (0,):
            row = self._con.execute(
                "SELECT value FROM dpsql.meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
        elif not create:
            raise StoreError(f"{self.path} is a DuckDB file but not a dpsql store; create a store "
                             "with: dpsql init PATH --policy POLICY.yaml")
        if version > latest:
            raise StoreError(f"{self.path} has store schema version {version}, newer than this "
                             f"dpsql understands ({latest}); upgrade dpsql")
        for number in range(version + 1, latest + 1):
            with self.transaction() as cur:
                for owner in owners:
                    for statement in owner.migrations.get(number, ()):
                        cur.execute(statement)
                cur.execute("INSERT OR REPLACE INTO dpsql.meta VALUES ('schema_version', ?)",
                            [str(number)])
                if number == 1:
                    cur.execute("INSERT INTO dpsql.meta VALUES ('secret', ?), ('created_at', ?)",
                                [secrets.token_hex(32), now().isoformat()])

    # -- connections --------------------------------------------------------------
    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new cursor on the hardened database (one per thread)."""
        return self._con.cursor()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor inside BEGIN ... COMMIT (ROLLBACK on any error), under the write lock."""
        with self.lock:
            cur = self._con.cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                cur.close()
                raise
            cur.execute("COMMIT")
            cur.close()

    @cached_property
    def secret(self) -> str:
        """The store's random secret, fixed at creation (seeds sampling); never shown."""
        row = self.cursor().execute("SELECT value FROM dpsql.meta WHERE key = 'secret'").fetchone()
        assert row is not None
        return str(row[0])


def install_udfs(con: duckdb.DuckDBPyConnection) -> None:
    """(Re)create the SQL macros shipped in ``dpsql/udfs/*.sql`` (schema ``udfs``)."""
    folder = resources.files("dpsql").joinpath("udfs")
    con.execute("CREATE SCHEMA IF NOT EXISTS udfs")
    for file in sorted((p for p in folder.iterdir() if p.name.endswith(".sql")),
                       key=lambda p: p.name):
        lines = [line for line in file.read_text("utf-8").splitlines()
                 if not line.strip().startswith("--")]  # ";" at a line end ends a statement
        for statement in "\n".join(lines).split(";\n"):
            if statement.strip(" ;\n"):
                con.execute(statement.strip())


def _connect(path: Path, limits: Mapping[str, str | int] | None = None
             ) -> duckdb.DuckDBPyConnection:
    config: DuckDBConfig = {**HARDENED_CONFIG, **(limits or {})}
    try:
        return duckdb.connect(str(path), config=config)
    except duckdb.IOException as err:
        text = str(err)
        if "lock" in text.lower():
            holder = re.search(r"PID (\d+)", text)
            who = f" (process {holder.group(1)})" if holder else ""
            raise StoreError(f"{path} is open for writing by another process{who}; stop it "
                             "(for example a running dpsql serve) and try again") from err
        if "permission denied" in text.lower():  # an OS failure, not a broken store
            raise PermissionError(errno.EACCES, "permission denied", str(path)) from err
        raise StoreError(f"{path} is not a readable DuckDB database ({text.splitlines()[0]}); "
                         "check the path (--db or $DPSQL_DB); if it was your store, restore "
                         "it from a backup") from err
    except duckdb.ConnectionException as err:
        raise StoreError(f"{path} is already open in this process with another configuration; "
                         "close other connections to it first") from err
    except duckdb.Error as err:
        raise StoreError(f"cannot open {path}: {str(err).splitlines()[0]}") from err
