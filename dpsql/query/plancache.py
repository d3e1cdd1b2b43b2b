"""Validated DP query plans by statement text, so a repeated text skips parsing and SQL generation.

Like a database's prepared-statement cache: the first time a text arrives it is
parsed, validated against the policy and planned; later arrivals under the same
policy (fingerprint) reuse that plan while the dataset's table still has the
column types it was planned with (read again on every query). The generated
SQL of a plan is kept on the entry per context (exact or noisy grid, bounds the
database enforces), so the engine sees the same query object and can reuse its
rendering. Nothing here depends on data: plans are built from the text, the
policy and the schema.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.query.model import QueryPlan
from dpsql.store import Store

#: Entries kept per open store (least recently used dropped first).
CAPACITY = 512


@dataclass
class Entry:
    """One planned text: its plan, the column types it was planned with, its SQL per context."""

    plan: QueryPlan
    types: Mapping[str, str]
    sql: dict[Any, exp.Select] = field(default_factory=dict)

    def generated(self, context: tuple[bool, Mapping[str, tuple[Fraction, Fraction]]],
                  build: Callable[[], exp.Select]) -> exp.Select:
        """The generated SQL for ``context`` (exact, enforced bounds), built once."""
        exact, enforced = context
        key = (exact, tuple(sorted(enforced.items())))
        if key not in self.sql:
            self.sql[key] = build()
        return self.sql[key]


class PlanCache:
    """The entries of one open store, keyed by (statement text, policy fingerprint)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, str], Entry] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str, fingerprint: str) -> Entry | None:
        """The entry of ``text`` under the policy ``fingerprint``, if kept."""
        with self._lock:
            entry = self._entries.get((text, fingerprint))
            if entry is not None:
                self._entries.move_to_end((text, fingerprint))
            return entry

    def put(self, text: str, fingerprint: str, entry: Entry) -> None:
        """Keep ``entry`` (dropping the least recently used beyond ``CAPACITY``)."""
        with self._lock:
            self._entries[(text, fingerprint)] = entry
            self._entries.move_to_end((text, fingerprint))
            while len(self._entries) > CAPACITY:
                self._entries.popitem(last=False)


def plans_of(store: Store) -> PlanCache:
    """The plan cache of an open store."""
    return store.state(PlanCache)
