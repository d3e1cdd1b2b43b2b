"""Durable answers of DP queries, so repeating a query never draws fresh noise.

A query's noisy measures are stored in the store (``dpsql.query_cache``) under a
key made of the user, the policy fingerprint, the normalized plan (what is
measured: dataset, keys, measures, WHERE) and the cost. The same query from the
same user with the same options gets the same numbers back at no cost, so
averaging repeats gains nothing; post-processing (ORDER BY, HAVING, LIMIT,
intervals) is re-applied to the stored values, so it may differ freely. The
cache lives in the store, so restarting the server does not re-draw noise. This
module encodes and decodes answers; :mod:`dpsql.answers` owns the table, and the
ledger writes an answer as it settles its request.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from dpsql.answers import ANSWERS, StoredAnswer
from dpsql.mechanisms.additive import Noise
from dpsql.privacy import PrivacyCost
from dpsql.query.model import QueryPlan
from dpsql.query.quantile import MeasureNoise, QuantileNoise
from dpsql.store import Store, now


@dataclass(frozen=True)
class CachedAnswer:
    """A stored answer: the charge that paid for it, the noise used, the noisy vectors.

    ``keys``: the keys partition selection released (None when the keys are public).
    """

    audit_id: int
    noises: tuple[MeasureNoise, ...]
    measures: list[np.ndarray]
    keys: tuple[Any, ...] | None = None


def cache_key(user: str, fingerprint: str, plan: QueryPlan, cost: PrivacyCost) -> str:
    """The identity of a measurement: who asked, under which policy, what, at what cost."""
    text = json.dumps({"user": user, "policy": fingerprint, "plan": plan.normalized(),
                       "cost": [cost.kind, str(cost.units), cost.infinite]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def lookup(store: Store, key: str) -> CachedAnswer | None:
    """The stored answer under ``key``, if any (including one whose settle is queued)."""
    found = store[ANSWERS].find(key)
    if found is None:
        return None
    noises = tuple(QuantileNoise.from_json(n) if n["mechanism"] == "quantile"
                   else Noise.from_json(n) for n in json.loads(found.noise))
    reader = pa.ipc.open_stream(pa.py_buffer(bytes(found.measures)))
    table = reader.read_all()
    measures = [table.column(name).to_numpy().astype(np.int64)
                for name in table.column_names if name != "keys"]
    keys = tuple(table.column("keys").to_pylist()) if "keys" in table.column_names else None
    return CachedAnswer(found.audit_id, noises, measures, keys)


def stored_row(key: str, user: str, plan: QueryPlan, fingerprint: str, audit_id: int,
               noises: tuple[MeasureNoise, ...], measures: list[np.ndarray],
               keys: tuple[Any, ...] | None = None) -> StoredAnswer:
    """The stored form of an answer, which the ledger writes as it settles.

    If the process dies before that commit, a repeat is simply charged again:
    losing a stored answer costs budget, never privacy.
    """
    table = pa.table({f"m{j}": pa.array(m, type=pa.int64()) for j, m in enumerate(measures)})
    if keys is not None:
        table = table.append_column("keys", pa.array(list(keys)))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return StoredAnswer(key, user, plan.dataset.name, fingerprint, audit_id, now(),
                        plan.normalized(), json.dumps([n.to_json() for n in noises]),
                        sink.getvalue().to_pybytes())
