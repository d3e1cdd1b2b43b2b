"""The sanitized catalog: what SQL clients may learn about a store, and where they ask.

Privacy: the catalog holds schema only. Datasets appear as tables in schema
``public`` under their policy names with their *visible* columns (hidden
columns never appear) and the column types of the underlying table; released
synthetic tables appear in schema ``released`` with their columns and a
comment naming their provenance. No row, row count, size, statistic or
histogram of a private table is ever read into it, so whatever SQL runs
against it cannot reveal a private value.

Clients' catalog queries are analyst SQL: they run in a sandbox process with a
hard memory limit (:mod:`dpsql.sandbox`), never in the server's. The server
writes the catalog database (dpsql's own SQL: :func:`pgcatalog.build_shared`
over :func:`relations`) to a file in a private folder when the store changes;
sandboxes open it read-only on their next catalog query, and keep a cursor per
client connection holding that connection's own rows in temporary tables (user,
settings, open cursors), written again only when they change.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from dpsql.engines.interrupt import Interrupter
from dpsql.errors import OutOfMemory, QueryCanceled
from dpsql.imports import table_columns, tables
from dpsql.policies import VERSIONS, active_policy
from dpsql.policy import Dataset
from dpsql.provenance import released_signature, releases
from dpsql.sandbox import SANDBOXES, Database, Setup
from dpsql.sandboxed import open_file
from dpsql.server import pgcatalog, rewrite
from dpsql.server.pgcatalog import Client, Relation
from dpsql.store import HARDENED_CONFIG, Store

REFRESH_SECONDS = 1.0
CATALOG_LIMITS: dict[str, str | int] = {"memory_limit": "256MB", "threads": 1,
                                        "max_temp_directory_size": "0B"}
_KEYS = itertools.count(1)  # names catalogs and connections in the sandboxes


def relations(store: Store) -> tuple[Relation, ...]:
    """The sanitized relations of the store under its active policy."""
    policy = active_policy(store)
    out = []
    for ds in policy.datasets.values():
        types = table_columns(store, ds.table)
        columns = tuple((c.name, types.get(c.name, "VARCHAR")) for c in ds.visible_columns)
        about = f"{ds.description}; " if ds.description else f"dataset {ds.name}: "
        out.append(Relation("public", ds.name, columns,
                            about + "aggregate queries only, answered with differential "
                            "privacy and charged to your budget",
                            _column_comments(ds, [name for name, _ in columns])))
    published = [r for r in releases(store) if r["record"].get("published", True)]
    provenance = {r["name"]: (r["dataset"], r["synthesizer"], r["privacy"], r["released_at"])
                  for r in published}  # a held release is named nowhere an analyst looks
    parents = {product.rpartition(".")[2]: r["name"] for r in published
               for product in r["record"].get("products", [])}
    for table in tables(store, "released"):
        columns = tuple(table_columns(store, table, schema="released").items())
        origin = provenance.get(table)
        parent = parents.get(table)
        source = origin[0] if origin else provenance[parent][0] if parent else ""
        if origin:
            comment = (f"synthetic release of dataset {origin[0]} by {origin[1]} "
                       f"({origin[2]}), released {origin[3]:%Y-%m-%d %H:%M}")
        elif parent:
            comment = f"a DP product of release {parent} (see dpsql releases {parent})"
        else:
            comment = "released synthetic table"
        out.append(Relation("released", table, columns, comment,
                            _column_comments(policy.datasets.get(source),
                                             [name for name, _ in columns])))
    return tuple(out)


def _column_comments(dataset: Dataset | None, names: list[str]) -> tuple[str | None, ...]:
    """The policy's description of each named column (None where it has none)."""
    described = {c.name: c.description for c in dataset.visible_columns} if dataset else {}
    return tuple(described.get(name) for name in names)


def _signature(store: Store) -> tuple[object, ...]:
    """Changes whenever what the catalog shows could change (policy version, releases)."""
    return (store[VERSIONS].version(), tuple(tables(store, "released")),
            released_signature(store))


@dataclass
class _Built:
    signature: tuple[object, ...]
    database: Database  # how a sandbox builds it
    names: frozenset[str]


class CatalogSource:
    """The shared catalog of one server, rebuilt when the store changes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.sandboxes = store[SANDBOXES]
        self._lock = threading.Lock()
        self._built: _Built | None = None
        self._checked = 0.0
        self._key = f"catalog-{next(_KEYS)}"
        self._versions = itertools.count(1)
        self._folder = Path(tempfile.mkdtemp(prefix="dpsql-catalog-"))

    def current(self) -> _Built:
        """The catalog matching the store now (checked at most once a second)."""
        with self._lock:
            built = self._built
            stamp = time.monotonic()
            if built is not None and stamp - self._checked < REFRESH_SECONDS:
                return built
            signature = _signature(self.store)
            self._checked = stamp
            if built is not None and built.signature == signature:
                return built
            shown = relations(self.store)
            # The catalog is tiny: a client query that tries to use the whole machine
            # (a huge generate_series, say) hits these limits, the sandbox's memory
            # limit or the statement timeout.
            config = {**HARDENED_CONFIG, **CATALOG_LIMITS}
            version = next(self._versions)
            path = self._folder / f"catalog-{version}.duckdb"
            writer = duckdb.connect(str(path), config=config)
            try:
                pgcatalog.build_shared(writer, shown)
            finally:
                writer.close()
            for old in self._folder.glob("catalog-*.duckdb*"):  # the one before may be in use
                if int(old.name.split("-")[1].split(".")[0]) < version - 1:
                    with contextlib.suppress(OSError):
                        old.unlink()
            database = Database(self._key, version, open_file, (str(path), config))
            self._built = _Built(signature, database, frozenset(r.name.lower() for r in shown))
            return self._built

    def user_relations(self) -> frozenset[str]:
        """Names of datasets and released tables (these are never catalog relations)."""
        return self.current().names

    def sql(self, text: str) -> pa.Table:
        """Run dpsql's own ``text`` on the shared catalog, in a sandbox (no client rows)."""
        return self.sandboxes.run(self.current().database, text, user="")

    def close(self) -> None:
        """Forget the catalog and remove its files (the store closes the sandboxes)."""
        with self._lock:
            self._built = None
            shutil.rmtree(self._folder, ignore_errors=True)


@dataclass
class ConnectionCatalog:
    """One client connection's view of the shared catalog, with its own client rows."""

    source: CatalogSource
    client: Client
    interrupts: Interrupter = field(default_factory=Interrupter)  # its session's
    _key: int = field(default_factory=lambda: next(_KEYS))

    def run(self, tree: rewrite.exp.Expr, ctx: rewrite.Context) -> pa.Table:
        """Answer a catalog query (raises CatalogQueryError for what the catalog lacks)."""
        sql = rewrite.rewrite(tree, ctx)
        setup = Setup(self._key, pgcatalog.prepare_client,
                      (self.client, dict(ctx.settings), tuple(ctx.cursors)))
        try:
            return self.source.sandboxes.run(self.source.current().database, sql,
                                             user=self.client.user, setup=setup,
                                             interrupts=self.interrupts)
        except (QueryCanceled, OutOfMemory) as err:
            raise rewrite.CatalogQueryError(err.sqlstate, str(err)) from err
        except duckdb.Error as err:
            raise _catalog_error(err) from err

    def close(self) -> None:
        """Nothing to release: a sandbox drops the least recently used connections' cursors."""


def _catalog_error(err: duckdb.Error) -> rewrite.CatalogQueryError:
    """A DuckDB error on the catalog database as a client error.

    The catalog holds no private data, so DuckDB's message can be shown.
    """
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    for prefix in ("Binder Error: ", "Catalog Error: ", "Parser Error: ",
                   "Conversion Error: ", "Invalid Input Error: "):
        first = first.replace(prefix, "")
    codes = [(duckdb.ParserException, "42601"), (duckdb.CatalogException, "42P01"),
             (duckdb.BinderException, "42703"), (duckdb.ConversionException, "22P02"),
             (duckdb.InvalidInputException, "22023")]
    for kind, code in codes:
        if isinstance(err, kind):
            return rewrite.CatalogQueryError(code, f"catalog query failed: {first}")
    return rewrite.CatalogQueryError("XX000", f"catalog query failed: {first}")
