"""Policy versions (``dpsql.policies``): the table's one owner, and applying a policy.

The store keeps every applied version with its fingerprint; the highest is in
force. Applying one (:func:`apply_policy`) checks it against the store's tables
(or its engines'), refuses one under which the ledger would forget what was
spent, and then in one transaction under the write lock: changes rows as the
caller prepares, trims the answer cache to the new shares, copies the public
tables, records the version and audits it. The active policy is parsed once
per version and kept per open store (:class:`PolicyVersions`, a store service).

This module sits above the store: it may import the engines and the
synthesizer catalog, which checking a policy needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import duckdb

from dpsql.answers import ANSWERS
from dpsql.domain import Domain
from dpsql.errors import PolicyError, ReleaseError, StoreError
from dpsql.imports import table_columns
from dpsql.ledger import Ledger, recorded_datasets
from dpsql.outcomes import Outcome
from dpsql.policy import Dataset, Policy, did_you_mean
from dpsql.public import load_public_tables
from dpsql.store import Store, StoreKey, Tables, now
from dpsql.synth.base import known_names

TABLES = Tables("policies", {1: ("""CREATE TABLE dpsql.policies (
    version INTEGER PRIMARY KEY, fingerprint VARCHAR NOT NULL, text VARCHAR NOT NULL,
    applied_by VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL, changes VARCHAR)""",)})


@dataclass(frozen=True)
class PolicyVersion:
    """One applied policy version: who applied it when, and what changed."""

    version: int
    fingerprint: str
    text: str
    applied_by: str
    applied_at: datetime
    changes: str | None


class PolicyVersions:
    """The versions of one open store, and the active policy parsed once per version.

    This process holds the file's only write lock, so a policy changes only
    through :func:`apply_policy`, which forgets the cached one (under the write
    lock, after its commit).
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._cached: tuple[int, Policy] | None = None

    def version(self) -> int:
        """The number of the active policy version (0: none yet)."""
        cached = self._cached
        if cached:
            return cached[0]
        row = self._store.cursor().execute("SELECT max(version) FROM dpsql.policies").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def active(self) -> Policy:
        """The policy in force (the latest applied).

        A miss reads under the write lock, so it cannot keep a version that an
        :func:`apply_policy` committing meanwhile replaces.
        """
        cached = self._cached
        if cached:
            return cached[1]
        store = self._store
        with store.lock:
            version = self.version()
            if version == 0:
                raise StoreError(f"{store.path} has no policy yet; apply one with: "
                                 "dpsql policy apply POLICY.yaml")
            row = store.cursor().execute("SELECT text FROM dpsql.policies WHERE version = ?",
                                         [version]).fetchone()
            assert row is not None
            policy = Policy.from_text(row[0], source=f"{store.path.name} policy v{version}",
                                      stored=True)
            self._cached = (version, policy)
            return policy

    def history(self) -> list[PolicyVersion]:
        """Every applied version, oldest first."""
        rows = self._store.cursor().execute(
            "SELECT version, fingerprint, text, applied_by, applied_at, changes "
            "FROM dpsql.policies ORDER BY version").fetchall()
        return [PolicyVersion(*row) for row in rows]

    def with_fingerprint(self, fingerprint: str) -> Policy | None:
        """The latest applied version with ``fingerprint``, parsed (None: never applied)."""
        row = self._store.cursor().execute(
            "SELECT text FROM dpsql.policies WHERE fingerprint = ? ORDER BY version DESC "
            "LIMIT 1", [fingerprint]).fetchone()
        return None if row is None else Policy.from_text(
            row[0], source=f"policy {fingerprint}", stored=True)

    def _add(self, cur: duckdb.DuckDBPyConnection, policy: Policy, applied_by: str,
             changes: list[str]) -> None:
        """Record ``policy`` as the next version in ``cur``'s transaction (write lock held)."""
        cur.execute("INSERT INTO dpsql.policies VALUES (?, ?, ?, ?, ?, ?)",
                    [self.version() + 1, policy.fingerprint, policy.text, applied_by, now(),
                     "\n".join(changes)])

    def _forget(self) -> None:
        self._cached = None


#: PolicyVersions of each open store: ``store[VERSIONS]``.
VERSIONS: StoreKey[PolicyVersions] = StoreKey("policies")


def active_policy(store: Store) -> Policy:
    """The policy in force in ``store``."""
    return store[VERSIONS].active()


def policy_history(store: Store) -> list[PolicyVersion]:
    """Every policy version applied to ``store``, oldest first."""
    return store[VERSIONS].history()


def release_dataset(store: Store, record: dict[str, Any]) -> Dataset:
    """The dataset of a release (its provenance ``record``) as the policy then in force had it."""
    policy = store[VERSIONS].with_fingerprint(record["policy_fingerprint"])
    if policy is None:
        raise ReleaseError(f"the policy release {record['name']!r} was made under is not in "
                           "the store")
    return policy.dataset(record["dataset"]["name"])


def release_domain(store: Store, record: dict[str, Any]) -> Domain:
    """The domain a release was made with (its columns, under the policy then in force)."""
    domain = Domain.from_dataset(release_dataset(store, record), record["columns"])
    shapes = record.get("within_bin_shapes", {}).get("probabilities", {})
    return replace(domain.with_shapes(shapes), public_rows=record["domain"].get("public_rows"))


def check_policy(store: Store, policy: Policy) -> list[str]:
    """Check the policy against the tables; returns notes (undeclared columns, hidden)."""
    notes, known = [], known_names()
    for ds in policy.datasets.values():
        for name in ds.synthesizers:
            if name not in known:
                raise PolicyError(f"{policy.source}: datasets.{ds.name}.synthesizers: "
                                  f"unknown synthesizer {name!r}"
                                  f"{did_you_mean(name, sorted(known))} (known: "
                                  f"{', '.join(sorted(known))})")
        actual = dataset_columns(store, ds, policy.source)
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


def dataset_columns(store: Store, ds: Dataset, source: str = "<policy>") -> dict[str, str]:
    """Column name -> type of a dataset's table: the store's, or its engine's (read now)."""
    if ds.engine is None:
        return table_columns(store, ds.table)
    from dpsql.engines import engine_for
    from dpsql.engines.base import EngineError
    from dpsql.engines.interrupt import Interrupter

    engine = engine_for(ds, store, Interrupter())
    try:
        return engine.column_types(ds.table)
    except EngineError as err:
        raise PolicyError(f"{source}: datasets.{ds.name}.engine: {err.message}") from None
    finally:
        engine.close()


def apply_policy(store: Store, policy: Policy, applied_by: str,
                 prepare: Callable[[duckdb.DuckDBPyConnection], list[str]] | None = None
                 ) -> list[str]:
    """Make ``policy`` the store's active one; returns the recorded changes.

    ``prepare(cursor)``, when given, runs first in the same transaction (e.g. to
    drop rows outside the new domains) and returns lines added to the changes.
    In that transaction too, each user's stored answers are trimmed to their
    share under the new policy (:func:`dpsql.answers.cache_share`), so that the
    cache stays within ``answer_cache_mb`` when the policy shrinks it or names
    more users, its public tables are copied into the store
    (:func:`dpsql.public.load_public_tables`), and the ledger audits it.
    """
    check_policy(store, policy)
    versions, answers = store[VERSIONS], store[ANSWERS]
    with store.lock:
        previous = versions.active() if versions.version() else None
        _check_ledger_continuity(store, previous, policy)
        changes = previous.diff(policy) if previous else ["(first policy)"]
        try:
            with store.transaction() as cur:
                if prepare is not None:
                    changes = changes + prepare(cur)
                dropped = answers.trim(policy, cur)
                if dropped:
                    changes.append(f"answer cache: {dropped} stored answers beyond their user's "
                                   "new share dropped (a repeat of one is charged again)")
                changes += load_public_tables(cur, policy)
                versions._add(cur, policy, applied_by, changes)
                Ledger(store, policy).record(applied_by, None, f"policy apply {policy.source}",
                                             Outcome.APPLIED, "; ".join(changes),
                                             action="policy", cursor=cur)
        except BaseException:
            answers.forget()  # the trim rolled back: read the answers again
            raise
        versions._forget()
    return changes


def _check_ledger_continuity(store: Store, previous: Policy | None, policy: Policy) -> None:
    """Refuse a policy under which the ledger would forget what was spent.

    Charges are recorded per dataset name: a dataset with recorded charges or
    grants must keep its name and table, and zCDP costs cannot be counted
    under pure accounting (rho-zCDP implies no pure epsilon).
    """
    for dataset, has_zcdp in recorded_datasets(store):
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
