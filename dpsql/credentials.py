"""Stored SQL passwords (``dpsql.credentials``): the table's one owner.

Each row holds a user's SCRAM-SHA-256 verifier, never a password
(:mod:`dpsql.passwords` makes and checks them). A change is audited by the
ledger in its transaction. Logins read the table through :class:`Credentials`
(a store service), once per change: a served store's commands run in the
server's process, and every change goes through :func:`save` or :func:`remove`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime

import duckdb

from dpsql.errors import ConfigurationError
from dpsql.ledger import Ledger
from dpsql.outcomes import Outcome
from dpsql.policies import active_policy
from dpsql.store import Store, StoreKey, Tables, now

TABLES = Tables("credentials", {1: ("""CREATE TABLE dpsql.credentials (
    user_name VARCHAR PRIMARY KEY, verifier VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL)""",)})


@dataclass(frozen=True)
class Credential:
    """Who has a password, and since when (the verifier stays in the store)."""

    user: str
    created_at: datetime


class Credentials:
    """The credentials table as the logins of this process read it: once per change."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()  # guards _rows and _generation (a leaf lock)
        self._rows: list[tuple[str, str]] | None = None
        self._generation = 0  # a read that began before a change is not kept

    def rows(self) -> list[tuple[str, str]]:
        """Every (user name, stored verifier), by name."""
        with self._lock:
            rows, generation = self._rows, self._generation
        if rows is None:
            found = self._store.cursor().execute(
                "SELECT user_name, verifier FROM dpsql.credentials ORDER BY user_name").fetchall()
            rows = [(str(name), str(text)) for name, text in found]
            with self._lock:
                if self._generation == generation:
                    self._rows = rows
        return rows

    def forget(self) -> None:
        """The table changed (or may have): read it again next time."""
        with self._lock:
            self._rows = None
            self._generation += 1


#: Credentials of each open store: ``store[CREDENTIALS]``.
CREDENTIALS: StoreKey[Credentials] = StoreKey("credentials")


def save(store: Store, user: str, verifier: str) -> None:
    """Store ``verifier`` for ``user`` (who must be declared in the active policy); audited."""
    if user not in active_policy(store).users:
        raise ConfigurationError(f"no user {user!r} in the store's policy; declare it under "
                                 "users: and run dpsql policy apply first")
    try:
        with store.transaction() as cur:
            cur.execute("INSERT OR REPLACE INTO dpsql.credentials VALUES (?, ?, ?)",
                        [user, verifier, now()])
            _audit(store, user, Outcome.SET, cur)
    finally:
        store[CREDENTIALS].forget()


def remove(store: Store, user: str) -> bool:
    """Delete ``user``'s credential; returns whether there was one (audited if so)."""
    try:
        with store.transaction() as cur:
            row = cur.execute("SELECT count(*) FROM dpsql.credentials WHERE user_name = ?",
                              [user]).fetchone()
            cur.execute("DELETE FROM dpsql.credentials WHERE user_name = ?", [user])
            found = bool(row and row[0])
            if found:
                _audit(store, user, Outcome.REMOVED, cur)
    finally:
        store[CREDENTIALS].forget()
    return found


def listed(store: Store) -> list[Credential]:
    """Every user with a credential, by name."""
    rows = store.cursor().execute("SELECT user_name, created_at FROM dpsql.credentials "
                                  "ORDER BY user_name").fetchall()
    return [Credential(str(name), at) for name, at in rows]


def verifier_of(store: Store, user: str) -> str | None:
    """The stored verifier of ``user``, read now (None: they have none)."""
    row = store.cursor().execute("SELECT verifier FROM dpsql.credentials WHERE user_name = ?",
                                 [user]).fetchone()
    return None if row is None else str(row[0])


def _audit(store: Store, user: str, outcome: Outcome, cur: duckdb.DuckDBPyConnection) -> None:
    """Audit a change of ``user``'s credential in the caller's transaction."""
    Ledger(store, active_policy(store)).record(user, None, None, outcome,
                                               action="credential", cursor=cur)
