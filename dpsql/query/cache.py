"""Durable answers of DP queries, so repeating a query never draws fresh noise.

A query's noisy measures are stored in the store (``dpsql.query_cache``) under a
key made of the user, the policy fingerprint, the normalized plan (what is
measured: dataset, keys, measures, WHERE) and the cost. The same query from the
same user with the same options gets the same numbers back at no cost, so
averaging repeats gains nothing; post-processing (ORDER BY, HAVING, LIMIT,
intervals) is re-applied to the stored values, so it may differ freely. The
cache lives in the store, so restarting the server does not re-draw noise.
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.privacy import PrivacyCost
from dpsql.query.mechanisms import Noise
from dpsql.query.model import QueryPlan
from dpsql.store import Store, now


@dataclass(frozen=True)
class CachedAnswer:
    """A stored answer: the charge that paid for it, the noise used, the noisy vectors."""

    audit_id: int
    noises: tuple[Noise, ...]
    measures: list[np.ndarray]


def cache_key(user: str, fingerprint: str, plan: QueryPlan, cost: PrivacyCost) -> str:
    """The identity of a measurement: who asked, under which policy, what, at what cost."""
    text = json.dumps({"user": user, "policy": fingerprint, "plan": plan.normalized(),
                       "cost": [cost.kind, str(cost.units), cost.infinite]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def lookup(store: Store, key: str) -> CachedAnswer | None:
    """The stored answer under ``key``, if any (including one still being written)."""
    with _pending_lock:
        waiting = _pending.get(store, {}).get(key)
    return waiting if waiting is not None else _stored(store, key)


def _stored(store: Store, key: str) -> CachedAnswer | None:
    """The answer written under ``key``, if any (a read only when the key may be there)."""
    if not store.state(_KnownKeys).may_hold(store, key):
        return None
    row = store.cursor().execute(
        "SELECT audit_id, noise, measures FROM dpsql.query_cache WHERE key = ?", [key]
    ).fetchone()
    if row is None:
        return None
    noises = tuple(Noise.from_json(n) for n in json.loads(row[1]))
    reader = pa.ipc.open_stream(pa.py_buffer(bytes(row[2])))
    table = reader.read_all()
    measures = [table.column(i).to_numpy().astype(np.int64) for i in range(table.num_columns)]
    return CachedAnswer(int(row[0]), noises, measures)


def save(store: Store, key: str, user: str, plan: QueryPlan, fingerprint: str, audit_id: int,
         noises: tuple[Noise, ...], measures: list[np.ndarray],
         also: Callable[[duckdb.DuckDBPyConnection], None] | None = None) -> list[np.ndarray]:
    """Keep an answer (and run ``also`` in the same transaction); returns the kept vectors.

    The answer is visible to :func:`lookup` at once and written to the store by
    the store's writer thread once the statement ends, so the analyst does not
    wait for a second durable commit. If the process dies first, a repeat is simply charged
    again: losing a stored answer costs budget, never privacy. A concurrent
    twin that got there first is kept: its numbers are returned instead.
    """
    answer = CachedAnswer(audit_id, noises, measures)
    with _pending_lock:  # a twin is still being written, or written already (read rarely)
        waiting = _pending.setdefault(store, {})
        twin = waiting.get(key) or _stored(store, key)
        if twin is None:
            waiting[key] = answer
    if twin is not None:
        if also is not None:  # this request was charged too: its audit row still closes
            store.defer(also, hold=True)
        return twin.measures
    store.state(_KnownKeys).add(key)
    created = now()

    def write(cur: duckdb.DuckDBPyConnection) -> None:  # serialized here, off the answer path
        table = pa.table({f"m{j}": pa.array(m, type=pa.int64())
                          for j, m in enumerate(measures)})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        row = [key, user, plan.dataset.name, fingerprint, audit_id, created, plan.normalized(),
               json.dumps([n.to_json() for n in noises]), sink.getvalue().to_pybytes()]
        cur.execute("INSERT INTO dpsql.query_cache VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT DO NOTHING", row)
        if also is not None:
            also(cur)

    def written() -> None:
        with _pending_lock:
            _pending.get(store, {}).pop(key, None)

    store.defer(write, written, hold=True)
    return measures


_pending: weakref.WeakKeyDictionary[Store, dict[str, CachedAnswer]] = \
    weakref.WeakKeyDictionary()
_pending_lock = threading.Lock()


class _KnownKeys:
    """The first 64 bits of every stored key, so a new query's miss needs no query.

    Read from the table on first use, then kept current by :func:`save`
    (this process is the file's only writer; a key is added before its write
    is queued, so none can slip between the read and the set). A prefix that is
    absent proves the key absent; a present one is confirmed against the table.
    """

    def __init__(self) -> None:
        self.prefixes: set[int] = set()
        self.loaded = False
        self.lock = threading.Lock()

    def may_hold(self, store: Store, key: str) -> bool:
        with self.lock:
            if not self.loaded:
                rows = store.cursor().execute("SELECT key FROM dpsql.query_cache").fetchall()
                self.prefixes.update(_prefix(r[0]) for r in rows)
                self.loaded = True
            return _prefix(key) in self.prefixes

    def add(self, key: str) -> None:
        with self.lock:
            self.prefixes.add(_prefix(key))


def _prefix(key: str) -> int:
    return int(key[:16], 16)


_SECRETS: weakref.WeakKeyDictionary[Store, str] = weakref.WeakKeyDictionary()


def secret(store: Store) -> str:
    """The store's secret (fixed at creation), read once per open store."""
    if store not in _SECRETS:
        _SECRETS[store] = store.secret
    return _SECRETS[store]
