"""Validated DP query plans by statement text, so a repeated text skips parsing and SQL generation.

Like a database's prepared-statement cache: the first time a user sends a text
it is parsed, validated against the policy and planned; later arrivals from the
same user under the same policy (fingerprint) reuse that plan while the
dataset's table still has the column types it was planned with (read again on
every query before it is used: see :func:`dpsql.query.dp.answer_dp`).
Plans are per user, so how fast a text is answered says nothing of what other
users asked. The generated SQL of a plan is kept on the entry per context
(exact or noisy grid, bounds the database enforces), with its rendering once it
has bound. Nothing here depends on data:
plans are built from the text, the policy and the schema.
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
from dpsql.store import StoreKey

#: Entries kept per open store (least recently used dropped first).
CAPACITY = 512


@dataclass
class Entry:
    """One planned text: its plan, the column types it was planned with, its SQL per context.

    ``texts``: per context, the rendered SQL once it has bound in this store; it
    binds again as it runs, so a repeat skips rendering and a separate bind.
    ``post_checked``: the answer column types its post-processing was checked
    with (:func:`dpsql.query.post.check_post`), so a repeat is not checked again.
    """

    plan: QueryPlan
    types: Mapping[str, str]
    sql: dict[Any, exp.Select] = field(default_factory=dict)
    texts: dict[Any, str] = field(default_factory=dict)
    post_checked: set[Any] = field(default_factory=set)

    def generated(self, context: tuple[bool, Mapping[str, tuple[Fraction, Fraction]]],
                  build: Callable[[], exp.Select]) -> tuple[exp.Select, Any]:
        """The generated SQL for ``context`` (exact, enforced bounds), built once, and its key."""
        exact, enforced = context
        key = (exact, tuple(sorted(enforced.items())))
        if key not in self.sql:
            self.sql[key] = build()
        return self.sql[key], key


class PlanCache:
    """The entries of one open store, keyed by (user, statement text, policy fingerprint).

    A store service (``store[PLANS]``).
    """

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, str, str], Entry] = OrderedDict()
        self._lock = threading.Lock()  # statements of many threads read and reorder the LRU

    def get(self, user: str, text: str, fingerprint: str) -> Entry | None:
        """The entry of ``user``'s ``text`` under the policy ``fingerprint``, if kept."""
        key = (user, text, fingerprint)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def drop(self, user: str, text: str, fingerprint: str) -> None:
        """Forget ``user``'s ``text`` under ``fingerprint`` (its table changed)."""
        with self._lock:
            self._entries.pop((user, text, fingerprint), None)

    def put(self, user: str, text: str, fingerprint: str, entry: Entry) -> None:
        """Keep ``entry`` (dropping the least recently used beyond ``CAPACITY``)."""
        key = (user, text, fingerprint)
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > CAPACITY:
                self._entries.popitem(last=False)


#: PlanCache of each open store: ``store[PLANS]``.
PLANS: StoreKey[PlanCache] = StoreKey("plans")

