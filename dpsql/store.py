"""The governed store: one DuckDB file holding sensitive tables and dpsql's own state.

The ``dpsql`` schema keeps the applied policies, the budget ledger, the audit
log, release provenance and credentials; ``released`` holds synthetic tables.
Every connection dpsql opens on a store is hardened: external access off
(no files, no URLs, no ATTACH), extension install and autoload off,
configuration locked. Files are read by a separate in-memory DuckDB
(:func:`open_file`), never by the store's connection, and imported as a stream
of Arrow batches (memory does not grow with rows); files are written by pyarrow.

DuckDB lets one process open a file for writing at a time (its file lock); a
second process gets :class:`StoreError` instead of a corrupt file. Within the
process there is one :class:`Store` per file, and every write transaction holds
its write lock (:meth:`Store.transaction`). The bookkeeping rows (charges,
grants, audit, stored answers) are written by :mod:`dpsql.ledger` only.
"""

from __future__ import annotations

import errno
import logging
import math
import re
import secrets
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa

from dpsql import scratch
from dpsql.domain import quote
from dpsql.errors import ConfigurationError, PolicyError, StoreError
from dpsql.files import make_store_private, private_umask
from dpsql.policy import Dataset, Policy, did_you_mean
from dpsql.synth.base import known_names

SCHEMA_VERSION = 7
# Rows per Arrow batch streamed into the store: a third of a DuckDB row group, which
# the store still writes whole; a full row group's batch held ~25 MB more at the peak.
IMPORT_BATCH_ROWS = 40_960
#: The store's limits while ``dpsql init`` imports: DuckDB keeps every block it writes
#: cached up to its memory limit (80% of RAM by default), so an import's memory would
#: grow with rows; under the cap it evicts blocks already on disk instead. One thread:
#: a large GROUP BY (the domain check's examples) needs ~40 MB a thread to spill.
IMPORT_LIMITS: dict[str, str | int] = {"memory_limit": "64MB", "threads": 1}

#: A ``duckdb.connect`` configuration (its stubs' type: a dict, invariant in its values).
DuckDBConfig = dict[str, str | bool | int | float | list[str]]

HARDENED_CONFIG: DuckDBConfig = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "lock_configuration": True,
}

# The audit rows of charges whose request never settled: the process that charged
# them ended first (a charged request's audit row is written when it settles).
_REPAIR_AUDIT = (
    "INSERT INTO dpsql.audit SELECT c.audit_id, c.ts, c.user_name, c.dataset, "
    "coalesce(c.action, 'query'), c.statement, c.kind, c.units, c.infinite, "
    "'charged', 'the process ended before the outcome was recorded', c.fingerprint "
    "FROM dpsql.charges c ANTI JOIN dpsql.audit a ON a.id = c.audit_id")

# Each migration brings the store from version n-1 to n; never edit a released one.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        "CREATE SCHEMA IF NOT EXISTS dpsql",
        "CREATE SCHEMA IF NOT EXISTS released",
        "CREATE TABLE dpsql.meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
        """CREATE TABLE dpsql.policies (
            version INTEGER PRIMARY KEY, fingerprint VARCHAR NOT NULL, text VARCHAR NOT NULL,
            applied_by VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL, changes VARCHAR)""",
        "CREATE SEQUENCE dpsql.event_ids",
        """CREATE TABLE dpsql.audit (
            id BIGINT PRIMARY KEY, ts TIMESTAMP NOT NULL, user_name VARCHAR NOT NULL,
            dataset VARCHAR, action VARCHAR NOT NULL, statement VARCHAR,
            kind VARCHAR, units HUGEINT, infinite BOOLEAN, outcome VARCHAR NOT NULL,
            reason VARCHAR, fingerprint VARCHAR)""",
        """CREATE TABLE dpsql.charges (
            id BIGINT PRIMARY KEY, ts TIMESTAMP NOT NULL, user_name VARCHAR NOT NULL,
            dataset VARCHAR NOT NULL, kind VARCHAR NOT NULL, units HUGEINT NOT NULL,
            infinite BOOLEAN NOT NULL, fingerprint VARCHAR NOT NULL, audit_id BIGINT NOT NULL)""",
        """CREATE TABLE dpsql.grants (
            id BIGINT PRIMARY KEY, ts TIMESTAMP NOT NULL, user_name VARCHAR NOT NULL,
            dataset VARCHAR NOT NULL, kind VARCHAR NOT NULL, units HUGEINT NOT NULL,
            infinite BOOLEAN NOT NULL, granted_by VARCHAR NOT NULL,
            fingerprint VARCHAR NOT NULL)""",
        """CREATE TABLE dpsql.releases (
            release_id VARCHAR PRIMARY KEY, name VARCHAR NOT NULL, dataset VARCHAR NOT NULL,
            synthesizer VARCHAR NOT NULL, privacy VARCHAR NOT NULL, released_by VARCHAR NOT NULL,
            released_at TIMESTAMP NOT NULL, superseded_by VARCHAR, record VARCHAR NOT NULL)""",
        """CREATE TABLE dpsql.credentials (
            user_name VARCHAR PRIMARY KEY, verifier VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL)""",
    ]),
    # The DP state of resumable releases (more copies later at no privacy cost).
    (2, [
        """CREATE TABLE dpsql.release_states (
            release_id VARCHAR PRIMARY KEY, synthesizer VARCHAR NOT NULL,
            state VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL)""",
    ]),
    # 3: DP query answers, kept so a repeated query (or a restart) never re-draws noise.
    (3, [
        """CREATE TABLE dpsql.query_cache (
            key VARCHAR PRIMARY KEY, user_name VARCHAR NOT NULL, dataset VARCHAR NOT NULL,
            fingerprint VARCHAR NOT NULL, audit_id BIGINT NOT NULL,
            created_at TIMESTAMP NOT NULL, plan VARCHAR NOT NULL, noise VARCHAR NOT NULL,
            measures BLOB NOT NULL)""",
    ]),
    # 4: a charge carries its request, so the audit row written after the charge (off the
    # answer path) can be rebuilt if the process ends before writing it.
    (4, [
        "ALTER TABLE dpsql.charges ADD COLUMN action VARCHAR",
        "ALTER TABLE dpsql.charges ADD COLUMN statement VARCHAR",
    ]),
    # 5: rebuild any audit row that an older dpsql (which wrote it after the charge) did
    # not live to write (the same SQL now runs at every open: Store._recover).
    (5, [_REPAIR_AUDIT]),
    # 6: release jobs (dpsql.jobs), run in a worker process and listed by dpsql jobs.
    (6, [
        "CREATE SEQUENCE dpsql.job_ids",
        """CREATE TABLE dpsql.jobs (
            id BIGINT PRIMARY KEY, user_name VARCHAR NOT NULL, kind VARCHAR NOT NULL,
            name VARCHAR NOT NULL, dataset VARCHAR, synthesizer VARCHAR,
            state VARCHAR NOT NULL, stage VARCHAR, fraction DOUBLE,
            submitted_at TIMESTAMP NOT NULL, finished_at TIMESTAMP, audit_id BIGINT,
            worker_pid INTEGER, folder VARCHAR, error VARCHAR)""",
    ]),
    # 7: the delta a charge's partition selection spends, which the ledger sums per
    # dataset so that no policy change lets the selections pass the policy's delta.
    (7, ["ALTER TABLE dpsql.charges ADD COLUMN delta DOUBLE"]),
]

logger = logging.getLogger(__name__)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_open_stores: dict[tuple[int, int] | None, Store] = {}  # by (device, inode): links share one
_open_lock = threading.Lock()  # guards _open_stores: one Store per file in the process
T = TypeVar("T")


def now() -> datetime:
    """The current time, timezone-aware (stored as TIMESTAMP)."""
    return datetime.now(timezone.utc)


def check_identifier(name: str, what: str = "name") -> str:
    """Accept only plain SQL identifiers for names dpsql will put into SQL."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ConfigurationError(
            f"{what} {name!r} is not a valid identifier; use letters, digits and _ "
            "(not starting with a digit)"
        )
    return name


def normalize_name(name: str) -> str:
    """A column name as a lower-case SQL identifier: ``income>50K`` -> ``income_50k``."""
    clean = re.sub(r"[^0-9a-zA-Z]+", "_", name.strip()).strip("_").lower()
    if not clean or clean[0].isdigit():
        clean = "c_" + clean
    return clean


@contextmanager
def open_file(path: str | Path, *, na: str | None = None) -> Iterator[duckdb.DuckDBPyRelation]:
    """The rows of a CSV or Parquet file, as a relation of a private in-memory DuckDB.

    The store's own connection never touches the file system; the relation is
    read lazily (stream it with :func:`batches`), and its DuckDB closes on exit.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigurationError(f"no such file: {path}")
    suffix = "".join(path.suffixes).lower()
    reader = duckdb.connect(":memory:")
    try:
        with _reading(path):
            if suffix.endswith(".parquet"):
                rel = reader.read_parquet(str(path))
            elif suffix.endswith((".csv", ".csv.gz", ".tsv", ".txt")):
                options: dict[str, Any] = {}
                if na is not None:
                    options["na_values"] = [na]
                rel = reader.read_csv(str(path), **options)
            else:
                raise ConfigurationError(f"cannot import {path.name}: use a .csv or .parquet file")
        yield rel
    finally:
        reader.close()


def read_file(path: str | Path, *, na: str | None = None) -> pa.Table:
    """Read a CSV or Parquet file into Arrow (all of it in memory; see :func:`open_file`)."""
    with open_file(path, na=na) as rel, _reading(Path(path)):
        return rel.to_arrow_table()


def batches(rel: duckdb.DuckDBPyRelation) -> pa.RecordBatchReader:
    """Stream ``rel`` as Arrow record batches, so memory holds a few batches, never the file."""
    return rel.to_arrow_reader(IMPORT_BATCH_ROWS)


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turn errors while reading ``path`` into a ConfigurationError.

    A streamed file's reader fails with an OSError (a bad value past the rows
    DuckDB sniffed, when its batch is read).
    """
    try:
        yield
    except (duckdb.Error, OSError) as err:
        raise ConfigurationError(f"cannot read {path}: {str(err).splitlines()[0]}") from err


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, or None when there is none."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


class Store:
    """An open governed DuckDB file, opened with :meth:`open` (one instance per file)."""

    def __init__(self, path: Path, connection: duckdb.DuckDBPyConnection) -> None:
        self.path = path
        self._con = connection
        self._users = 1
        self._key: tuple[int, int] | None = None  # (device, inode) of the file, once open
        # Held by every write transaction: they read, check, then write (budgets, ids,
        # policy versions), and DuckDB would abort a second concurrent writer of a row.
        self.lock = threading.RLock()
        self._policy_cache: tuple[int, Policy] | None = None
        self._state: dict[type, Any] = {}
        self._state_lock = threading.Lock()  # guards _state: one kind() per open store

    # -- opening ----------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, create: bool = False,
             limits: Mapping[str, str | int] | None = None) -> Store:
        """Open (or with ``create`` make) the store at ``path``; one instance per process.

        ``limits`` (DuckDB settings such as ``memory_limit``) apply to a new
        connection; an instance already open keeps its own.

        The instance is found by the file's device and inode, so the same file
        reached through a hard link, a symlink or another name shares it: two
        DuckDB instances on one file would each keep their own charges.
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
                store._migrate(create)
                store._recover()
                store._install_udfs()
                store._key = _file_identity(resolved)
                if store._key is None:
                    raise StoreError(f"{path} disappeared while it was opened; try again")
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
            for state in self._state.values():  # release jobs, the free queries' database
                close = getattr(state, "close", None)
                if callable(close):
                    close()
            self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self, create: bool) -> None:
        con = self._con
        has_meta = con.execute(
            "SELECT count(*) FROM information_schema.tables "
            "WHERE table_schema = 'dpsql' AND table_name = 'meta'"
        ).fetchone()
        version = 0
        if has_meta and has_meta[0]:
            row = con.execute(
                "SELECT value FROM dpsql.meta WHERE key = 'schema_version'"
            ).fetchone()
            version = int(row[0]) if row else 0
        elif not create:
            raise StoreError(f"{self.path} is a DuckDB file but not a dpsql store; create a store "
                             "with: dpsql init PATH --policy POLICY.yaml")
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has store schema version {version}, newer than this "
                             f"dpsql understands ({SCHEMA_VERSION}); upgrade dpsql")
        for number, statements in MIGRATIONS:
            if number <= version:
                continue
            with self.transaction() as cur:
                for statement in statements:
                    cur.execute(statement)
                cur.execute("INSERT OR REPLACE INTO dpsql.meta VALUES ('schema_version', ?)",
                            [str(number)])
                if number == 1:
                    cur.execute("INSERT INTO dpsql.meta VALUES ('secret', ?), ('created_at', ?)",
                                [secrets.token_hex(32), now().isoformat()])

    def _recover(self) -> None:
        """Close what the last process to open the file left open.

        Requests it charged but never settled get their audit row (``charged``).
        Release jobs it left queued or running become ``interrupted``: their
        charge stays; the write of their result is one transaction, so nothing
        was written; their temporary folders, which hold the bounded rows, are
        removed, also one made before its job row recorded it (:mod:`dpsql.scratch`).
        This runs before anything else in this process opens a request.
        """
        scratch.sweep(self.path)
        with self.transaction() as cur:
            cur.execute(_REPAIR_AUDIT)
            for (folder,) in cur.execute("SELECT folder FROM dpsql.jobs WHERE state IN "
                                         "('queued', 'running') AND folder IS NOT NULL"
                                         ).fetchall():
                shutil.rmtree(folder, ignore_errors=True)  # the bounded rows it exported
            orphans = "SELECT audit_id FROM dpsql.jobs WHERE state IN ('queued', 'running')"
            cur.execute("UPDATE dpsql.audit SET outcome = 'interrupted', reason = 'the process "
                        f"running the release ended; nothing was written' WHERE id IN ({orphans})")
            cur.execute("UPDATE dpsql.jobs SET state = 'interrupted', finished_at = ?, "
                        "error = 'the process running it ended; nothing was written' "
                        "WHERE state IN ('queued', 'running')", [now()])

    def _install_udfs(self) -> None:
        with self.transaction() as cur:
            install_udfs(cur)

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

    def state(self, kind: type[T]) -> T:
        """This open store's one ``kind()``, made on first use.

        For what other modules keep about an open store in memory (running
        totals, plans): it lives as long as the store stays open in this process.
        """
        with self._state_lock:
            found = self._state.get(kind)
            if found is None:
                found = self._state[kind] = kind()
            return found

    # -- state ------------------------------------------------------------------------
    @cached_property
    def secret(self) -> str:
        """The per-store random secret (seeds contribution sampling); never shown to analysts.

        Fixed when the store is created, so it is read once.
        """
        row = self.cursor().execute("SELECT value FROM dpsql.meta WHERE key = 'secret'").fetchone()
        assert row is not None
        return str(row[0])

    def tables(self) -> list[str]:
        """Sensitive tables in the main schema."""
        rows = self.cursor().execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
            "ORDER BY table_name"
        ).fetchall()
        return [r[0] for r in rows]

    def table_columns(self, table: str, schema: str = "main") -> dict[str, str]:
        """Column name -> DuckDB type of a table (empty if it does not exist)."""
        rows = self.cursor().execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
            [schema, table],
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    def import_table(self, name: str, path: str | Path, *, na: str | None = None,
                     normalize: bool = True, replace: bool = False,
                     bounds: Mapping[str, tuple[float, float]] | None = None,
                     prepare: Callable[[duckdb.DuckDBPyConnection, str, Mapping[str, str]],
                                       None] | None = None) -> dict[str, str]:
        """Import a CSV/Parquet file as sensitive table ``name``; returns renamed columns.

        ``prepare(cursor, relation, types)``, when given, may check and change the rows
        (a temporary table) in the import's transaction before they are stored; the
        domain checks of :mod:`dpsql.outside` use it.

        ``bounds`` (column -> declared bounds, from the policy) are enforced: each
        such column of an integer type or DOUBLE gets a CHECK constraint, so the
        table can never hold a value outside its bounds and DP queries need not
        clamp it (:meth:`dpsql.engines.local.DuckDBEngine.enforced_bounds`). A value
        outside its bounds refuses the import. Whether a column is enforced is thus
        the administrator's choice, never a fact about the rows (it shows in query
        times).
        """
        check_identifier(name, "table name")
        path = Path(path)
        with open_file(path, na=na) as rel:
            renames: dict[str, str] = {}
            if normalize:
                names = [normalize_name(c) for c in rel.columns]
                if len(set(names)) != len(names):
                    raise ConfigurationError(f"{path}: column names collide once normalized; "
                                             "import with --keep-names")
                renames = {old: new for old, new in zip(rel.columns, names, strict=True)
                           if old != new}
                rel = rel.select(", ".join(f"{quote(old)} AS {quote(new)}"
                                           for old, new in zip(rel.columns, names, strict=True)))
            with self.transaction() as cur:
                if name in self.tables() and not replace:
                    raise ConfigurationError(f"table {name!r} already exists; pass --replace "
                                             "to overwrite it")
                self._store_rows(cur, name, rel, path, bounds or {}, prepare)
        return renames

    def _store_rows(self, cur: duckdb.DuckDBPyConnection, name: str,
                    rel: duckdb.DuckDBPyRelation, path: Path,
                    bounds: Mapping[str, tuple[float, float]],
                    prepare: Callable[[duckdb.DuckDBPyConnection, str, Mapping[str, str]],
                                      None] | None) -> None:
        """Stream ``rel`` into table ``name``, then check (and ``prepare``) it there.

        The rows go to the store file batch by batch, never all into memory. A table
        with enforced bounds is staged first: DuckDB cannot add a CHECK constraint to
        a table, so the checked rows are copied into one declared with them.
        """
        final = f"main.{quote(name)}"
        rows = "dpsql.import_staged" if set(bounds) & set(rel.columns) else final
        with _reading(path), batches(rel) as stream:
            cur.execute(f"DROP TABLE IF EXISTS {rows}")
            cur.from_arrow(stream.schema.empty_table()).create(rows)
            for batch in stream:  # registering each batch instead would keep them all alive
                cur.from_arrow(batch).insert_into(rows)
        source = cur.sql(f"SELECT * FROM {rows}")
        types = {c: str(t) for c, t in zip(source.columns, source.types, strict=True)}
        if prepare is not None:
            prepare(cur, rows, types)
        checks = _enforced_checks(cur, rows, types, bounds, path)
        if rows != final:
            columns = ", ".join(
                f"{quote(c)} {t}" + (f" CHECK ({checks[c]})" if c in checks else "")
                for c, t in types.items())
            cur.execute(f"CREATE OR REPLACE TABLE {final} ({columns})")
            cur.execute(f"INSERT INTO {final} SELECT * FROM {rows}")
            cur.execute(f"DROP TABLE {rows}")

    # -- policy lifecycle -----------------------------------------------------------------
    def policy_version(self) -> int:
        """The number of the active policy version (0: none yet).

        Cached: this process holds the file's only write lock, so a policy can
        change only through :meth:`apply_policy`, which clears the cache (under the
        write lock, after its commit).
        """
        if self._policy_cache:
            return self._policy_cache[0]
        row = self.cursor().execute("SELECT max(version) FROM dpsql.policies").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def active_policy(self) -> Policy:
        """The policy in force (the latest applied), parsed and cached by version.

        A miss reads under the write lock, so it cannot keep a version that an
        :meth:`apply_policy` committing meanwhile replaces.
        """
        cached = self._policy_cache
        if cached:
            return cached[1]
        with self.lock:
            version = self.policy_version()
            if version == 0:
                raise StoreError(f"{self.path} has no policy yet; apply one with: "
                                 "dpsql policy apply POLICY.yaml")
            row = self.cursor().execute("SELECT text FROM dpsql.policies WHERE version = ?",
                                        [version]).fetchone()
            assert row is not None
            policy = Policy.from_text(row[0], source=f"{self.path.name} policy v{version}",
                                      stored=True)
            self._policy_cache = (version, policy)
            return policy

    def check_policy(self, policy: Policy) -> list[str]:
        """Check the policy against the tables; returns notes (undeclared columns, hidden)."""
        notes, known = [], known_names()
        for ds in policy.datasets.values():
            for name in ds.synthesizers:
                if name not in known:
                    raise PolicyError(f"{policy.source}: datasets.{ds.name}.synthesizers: "
                                      f"unknown synthesizer {name!r}"
                                      f"{did_you_mean(name, sorted(known))} (known: "
                                      f"{', '.join(sorted(known))})")
            actual = self.dataset_columns(ds, policy.source)
            if not actual:
                raise PolicyError(f"{policy.source}: datasets.{ds.name}.table: no table "
                                  f"{ds.table!r} in the store; import it with dpsql init "
                                  f"--import {ds.table}=FILE")
            for col in ds.columns.values():
                where = f"{policy.source}: datasets.{ds.name}.columns.{col.name}"
                if col.name not in actual:
                    raise PolicyError(f"{where}: table {ds.table!r} has no such column "
                                      f"(it has: {', '.join(actual)})")
                _check_type(where, col.type, actual[col.name], col.values)
            undeclared = sorted(set(actual) - set(ds.columns))
            if undeclared:
                notes.append(f"dataset {ds.name}: columns not in the policy are hidden: "
                             f"{', '.join(undeclared)}")
        return notes

    def dataset_columns(self, ds: Dataset, source: str = "<policy>") -> dict[str, str]:
        """Column name -> type of a dataset's table: the store's, or its engine's (read now)."""
        if ds.engine is None:
            return self.table_columns(ds.table)
        from dpsql.engines import engine_for
        from dpsql.engines.base import EngineError
        from dpsql.engines.interrupt import Interrupter

        engine = engine_for(ds, self, Interrupter())
        try:
            return engine.column_types(ds.table)
        except EngineError as err:
            raise PolicyError(f"{source}: datasets.{ds.name}.engine: {err.message}") from None
        finally:
            engine.close()

    def apply_policy(self, policy: Policy, applied_by: str,
                     prepare: Callable[[duckdb.DuckDBPyConnection], list[str]] | None = None,
                     *, audit: Callable[[duckdb.DuckDBPyConnection, list[str]], None]
                     ) -> list[str]:
        """Record ``policy`` as the active one; returns the list of changes.

        ``prepare(cursor)``, when given, runs first in the same transaction (e.g. to
        drop rows outside the new domains) and returns lines added to the changes;
        ``audit(cursor, changes)`` writes the audit row in it
        (:func:`dpsql.ledger.apply_policy` passes it).
        """
        self.check_policy(policy)
        with self.lock:
            version = self.policy_version()
            previous = self.active_policy() if version else None
            self._check_ledger_continuity(previous, policy)
            changes = previous.diff(policy) if previous else ["(first policy)"]
            with self.transaction() as cur:
                if prepare is not None:
                    changes = changes + prepare(cur)
                cur.execute(
                    "INSERT INTO dpsql.policies VALUES (?, ?, ?, ?, ?, ?)",
                    [version + 1, policy.fingerprint, policy.text, applied_by, now(),
                     "\n".join(changes)],
                )
                audit(cur, changes)
            self._policy_cache = None
        return changes

    def _check_ledger_continuity(self, previous: Policy | None, policy: Policy) -> None:
        """Refuse a policy under which the ledger would forget what was spent.

        Charges are recorded per dataset name: a dataset with recorded charges or
        grants must keep its name and table, and zCDP costs cannot be counted
        under pure accounting (rho-zCDP implies no pure epsilon).
        """
        rows = self.cursor().execute(
            "SELECT dataset, bool_or(kind = 'zcdp') FROM (SELECT dataset, kind FROM "
            "dpsql.charges UNION ALL SELECT dataset, kind FROM dpsql.grants) GROUP BY dataset "
            "ORDER BY dataset").fetchall()
        for dataset, has_zcdp in rows:
            where = f"{policy.source}: datasets.{dataset}"
            if dataset not in policy.datasets:
                raise PolicyError(f"{where}: dataset {dataset!r} has budget spent or granted "
                                  "in the ledger; a policy cannot drop or rename it, which would "
                                  f"forget that spending; keep dataset {dataset!r}")
            old_table = previous.datasets[dataset].table \
                if previous and dataset in previous.datasets else None
            if old_table is not None and policy.datasets[dataset].table != old_table:
                raise PolicyError(f"{where}.table: dataset {dataset!r} has budget spent on "
                                  f"table {old_table!r}; keep that table for it")
            if has_zcdp and policy.accounting == "pure":
                raise PolicyError(f"{policy.source}: accounting: the ledger holds zCDP costs "
                                  f"on {dataset!r}, which pure accounting cannot count; keep "
                                  "accounting: zcdp")

    def policy_history(self) -> list[dict[str, Any]]:
        """Every applied policy version, oldest first."""
        rows = self.cursor().execute(
            "SELECT version, fingerprint, applied_by, applied_at, changes FROM dpsql.policies "
            "ORDER BY version"
        ).fetchall()
        keys = ("version", "fingerprint", "applied_by", "applied_at", "changes")
        return [dict(zip(keys, r, strict=False)) for r in rows]


#: Column types whose values a CHECK (col BETWEEN lo AND hi) bounds exactly (NaN and
#: infinities fail it). FLOAT compares in single precision, wide decimals and HUGEINT
#: are read through casts: those are always clamped instead.
BOUNDABLE_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT",
                   "UINTEGER", "DOUBLE")


def _enforced_checks(cur: duckdb.DuckDBPyConnection, relation: str, types: Mapping[str, str],
                     bounds: Mapping[str, tuple[float, float]], source: str | Path
                     ) -> dict[str, str]:
    """CHECK expressions for the bounded columns of ``relation`` (all must fit)."""
    candidates = {c: b for c, b in bounds.items() if types.get(c, "").upper() in BOUNDABLE_TYPES}
    if not candidates:
        return {}
    checks = {c: f"{quote(c)} BETWEEN {_bound_literal(lo)} AND {_bound_literal(hi)}"
              for c, (lo, hi) in candidates.items()}
    fits = cur.execute("SELECT " + ", ".join(
        f"coalesce(bool_and({quote(c)} IS NULL OR {check}), TRUE)"
        for c, check in checks.items()) + f" FROM {relation}").fetchone()
    assert fits is not None
    outside = [c for c, ok in zip(checks, fits, strict=True) if not ok]
    if outside:
        raise ConfigurationError(
            f"{source}: column(s) {', '.join(outside)} hold values outside their policy "
            "bounds, which cannot be enforced; widen the bounds, or import without "
            "enforcing them (every query then clamps the values)")
    return checks


def _bound_literal(value: float) -> str:
    """A bound as an exact SQL literal (integers in full, so a BIGINT compares exactly)."""
    number = float(value)
    if not math.isfinite(number):
        raise ConfigurationError(f"bound {value} is not finite")
    return str(int(number)) if number.is_integer() else repr(number)


def install_udfs(con: duckdb.DuckDBPyConnection) -> None:
    """(Re)create the SQL macros shipped in ``dpsql/udfs/*.sql`` (schema ``udfs``)."""
    folder = resources.files("dpsql").joinpath("udfs")
    con.execute("CREATE SCHEMA IF NOT EXISTS udfs")
    for file in sorted((p for p in folder.iterdir() if p.name.endswith(".sql")),
                       key=lambda p: p.name):
        for statement in _statements(file.read_text("utf-8")):
            con.execute(statement)


def _statements(script: str) -> list[str]:
    """Split a macro file into statements (``;`` at a line end ends one; ``--`` comments)."""
    lines = [line for line in script.splitlines() if not line.strip().startswith("--")]
    return [part.strip() for part in "\n".join(lines).split(";\n") if part.strip(" ;\n")]


def _check_type(where: str, col_type: str, sql_type: str, values: tuple[Any, ...] | None) -> None:
    numeric = any(t in sql_type for t in ("INT", "DECIMAL", "DOUBLE", "FLOAT", "REAL"))
    if col_type in ("integer", "float") and not numeric:
        raise PolicyError(f"{where}: declared {col_type} but the table column is {sql_type}; "
                          "declare it categorical or import it as a number")
    if col_type == "categorical" and values is not None:
        stringy = sql_type in ("VARCHAR", "TEXT") or sql_type.startswith("ENUM")
        for value in values:
            if value is None:
                continue
            if stringy != isinstance(value, str) and sql_type != "BOOLEAN":
                kind = "text" if stringy else "numbers"
                raise PolicyError(f"{where}: the table column is {sql_type}, so values must be "
                                  f"{kind} (got {value!r}); quote or unquote them in the policy")


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
