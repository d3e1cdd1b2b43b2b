"""Stored answers of DP queries (``dpsql.query_cache``): the table's one owner.

A DP query's noisy measures are stored under a key naming who asked what under
which policy at what cost (:func:`dpsql.query.cache.cache_key`), so a repeat is
served free and never draws fresh noise, across restarts too. An answer is
written only as its request settles, in the ledger's write transaction: the
ledger holds it (:meth:`AnswerCache.hold`) and writes it with the outcome
(:meth:`AnswerCache.insert`), so a stored answer always has its audit row. Each
user's answers are kept within their share of ``answer_cache_mb``
(:func:`cache_share`): only a user's own answers are dropped, so what another
user stores never decides what this one pays for a repeat.

:class:`AnswerCache` (a store service) knows every stored key and its size. It
is the table's only writer, and DuckDB lets one process at a time open the
file, so a key it does not know is stored nowhere: the usual miss reads nothing.
Its writers hold the store's write lock; readers take no lock.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from datetime import datetime

import duckdb

from dpsql.policy import Policy
from dpsql.store import Store, StoreKey, Tables

TABLES = Tables("answers", {
    # 3: DP query answers, kept so a repeated query (or a restart) never re-draws noise.
    3: ("""CREATE TABLE dpsql.query_cache (
            key VARCHAR PRIMARY KEY, user_name VARCHAR NOT NULL, dataset VARCHAR NOT NULL,
            fingerprint VARCHAR NOT NULL, audit_id BIGINT NOT NULL,
            created_at TIMESTAMP NOT NULL, plan VARCHAR NOT NULL, noise VARCHAR NOT NULL,
            measures BLOB NOT NULL)""",),
})


@dataclass(frozen=True)
class StoredAnswer:
    """One row of ``dpsql.query_cache``, in its column order.

    ``plan``: the normalized plan measured; ``noise``: each measure's noise as
    JSON; ``measures``: the noisy vectors as an Arrow IPC stream
    (:func:`dpsql.query.cache.stored_row` encodes them).
    """

    key: str
    user: str
    dataset: str
    fingerprint: str
    audit_id: int
    created_at: datetime
    plan: str
    noise: str
    measures: bytes

    @property
    def size(self) -> int:
        """The bytes it counts against its user's share."""
        return len(self.plan.encode()) + len(self.noise.encode()) + len(self.measures)


def cache_share(policy: Policy) -> int:
    """Each user's share of the answer cache in bytes: ``answer_cache_mb`` split equally.

    Every user the policy names (administrators too) gets the same share, a
    public figure no query changes; a user's answers are dropped only to keep
    that user within it, so one user's answers never push out another's.
    """
    return int(policy.answer_cache_mb * 1e6) // max(1, len(policy.users))


class AnswerCache:
    """The stored answers of one open store: their keys and sizes, and those not written yet.

    ``_index``: key -> size of every stored answer, committed or held, oldest
    first (None: read them again from the table); ``_shelves``: the same per user,
    and ``_shelf_bytes`` each user's sum. ``_held``: the answers whose settle the
    ledger has queued but not committed, served from here meanwhile.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._index: dict[str, int] | None = None
        self._shelves: dict[str, dict[str, int]] = {}
        self._shelf_bytes: dict[str, int] = {}
        self._held: dict[str, StoredAnswer] = {}

    # -- reading (no lock) -------------------------------------------------------------
    def find(self, key: str) -> StoredAnswer | None:
        """The answer stored under ``key`` (committed, or held for the next write), if any."""
        held = self._held.get(key)  # one dict read: atomic
        if held is not None:
            return held
        index = self._index  # one attribute read: atomic
        if index is None:
            with self._store.lock:
                index = self._read(self._store.cursor())
        if key not in index:  # the usual miss reads nothing
            return None
        row = self._store.cursor().execute(
            "SELECT * FROM dpsql.query_cache WHERE key = ?", [key]).fetchone()
        return None if row is None else StoredAnswer(*row)

    # -- writing (the caller holds the store's write lock) -----------------------------
    def hold(self, answer: StoredAnswer) -> bool:
        """Count ``answer`` stored from now on, to be written with its settle.

        Returns False, holding nothing, when a concurrent twin's answer is already
        stored under the same key (the caller serves that one).
        """
        index = self._read(self._store.cursor())
        if answer.key in index:
            return False
        self._put(index, answer.key, answer.user, answer.size)
        self._held[answer.key] = answer
        return True

    def insert(self, cur: duckdb.DuckDBPyConnection, answer: StoredAnswer) -> None:
        """Write a held answer in ``cur``'s transaction (the ledger's, with its outcome)."""
        cur.execute("INSERT INTO dpsql.query_cache VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    list(astuple(answer)))

    def written(self, answer: StoredAnswer) -> None:
        """``answer``'s transaction committed (or gave it up): serve it from the table."""
        self._held.pop(answer.key, None)

    def forget(self) -> None:
        """A write transaction rolled back: read the stored answers again next time."""
        self._index = None

    def evict(self, user: str, share: int, cur: duckdb.DuckDBPyConnection) -> list[str]:
        """Drop ``user``'s oldest answers until theirs take at most 90% of ``share`` bytes.

        Only when theirs pass ``share``. Called in a write transaction that commits
        the deletion; returns the keys dropped. Held answers are kept: their rows
        are not written yet.
        """
        index = self._read(cur)
        shelf = self._shelves.get(user, {})
        if self._shelf_bytes.get(user, 0) <= share:
            return []
        dropped = []
        for key in list(shelf):
            if self._shelf_bytes[user] <= share * 0.9:
                break
            if key in self._held:
                continue
            self._shelf_bytes[user] -= shelf.pop(key)
            del index[key]
            dropped.append(key)
        cur.execute("DELETE FROM dpsql.query_cache WHERE list_contains(?, key)", [dropped])
        return dropped

    def trim(self, policy: Policy, cur: duckdb.DuckDBPyConnection) -> int:
        """Drop every user's oldest answers beyond their share under ``policy``.

        A user ``policy`` does not name has no share: their answers are dropped.
        Returns how many were dropped (in ``cur``'s transaction).
        """
        self._read(cur)
        share = cache_share(policy)
        return sum(len(self.evict(user, share if user in policy.users else 0, cur))
                   for user in list(self._shelves))

    def _read(self, cur: duckdb.DuckDBPyConnection) -> dict[str, int]:
        """The index, read from the table (and the held answers) when it is not kept."""
        if self._index is None:
            rows = cur.execute(
                "SELECT key, user_name, strlen(plan) + strlen(noise) + octet_length(measures) "
                "FROM dpsql.query_cache ORDER BY created_at, key").fetchall()
            index: dict[str, int] = {}  # filled, then published whole: readers take no lock
            self._shelves, self._shelf_bytes = {}, {}
            for key, user, size in rows:
                self._put(index, key, user, int(size))
            for key, held in self._held.items():
                if key not in index:
                    self._put(index, key, held.user, held.size)
            self._index = index
        return self._index

    def _put(self, index: dict[str, int], key: str, user: str, size: int) -> None:
        index[key] = size
        self._shelves.setdefault(user, {})[key] = size
        self._shelf_bytes[user] = self._shelf_bytes.get(user, 0) + size


#: AnswerCache of each open store: ``store[ANSWERS]``.
ANSWERS: StoreKey[AnswerCache] = StoreKey("answers")

