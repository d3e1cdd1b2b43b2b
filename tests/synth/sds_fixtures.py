"""Real stores and fitted SDS models for the SDS tests (the bundled Adult sample)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from pathlib import Path

import numpy as np

import dpsql
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.policies import active_policy
from dpsql.store import Store
from dpsql.synth.sds import _encoded
from dpsql.synth.sds.aggregates import Level
from dpsql.synth.sds.tuples import EMPTY, Items, TupleSpace, TupleTable
from tests.conftest import ADULT_POLICY, ADULT_SAMPLE

COLUMNS = ("age", "workclass", "race", "sex", "relationship", "income_50k")


def open_adult(tmp: Path, policy: Path = ADULT_POLICY, csv: Path = ADULT_SAMPLE) -> Store:
    """A governed store over the Adult sample (zCDP policy), left open."""
    store, _ = dpsql.init(tmp / "adult.duckdb", policy, {"adult": csv})
    return store


def source_and_domain(store: Store, columns: Sequence[str] | None = COLUMNS):
    """The bounded source relation and the domain of ``columns``."""
    dataset = active_policy(store).dataset("adult")
    domain = Domain.from_dataset(dataset, columns)
    return bounded_relation(store, dataset), domain


def item_rows(store: Store, columns: Sequence[str] | None = COLUMNS) -> tuple[np.ndarray, Items]:
    """The true records as item rows, read like the synthesizer reads them."""
    source, domain = source_and_domain(store, columns)
    items = Items(domain)
    return items.from_codes(_encoded(source, domain)), items


def tuple_counts(rows: np.ndarray, k: int) -> dict[tuple[int, ...], int]:
    """Exact counts of every k-tuple of items in ``rows`` (empty cells make no tuple)."""
    out: dict[tuple[int, ...], int] = {}
    for row in rows.tolist():
        present = [x for x in row if x != EMPTY]
        for combo in combinations(present, k):
            out[combo] = out.get(combo, 0) + 1
    return out


class FakeDomainItems(Items):
    """Items over columns of the given sizes, without a policy."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = np.array(sizes, dtype=np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(self.sizes)[:-1])).astype(np.int64)
        self.count = int(self.sizes.sum())
        self.column = np.repeat(np.arange(len(sizes)), self.sizes).astype(np.int64)
        self.code = (np.arange(self.count) - self.offsets[self.column]).astype(np.int64)


def levels_from(items: Items, counts: dict[tuple[int, ...], int]) -> list[Level]:
    """Levels holding the given tuple counts (every length from 1 up)."""
    levels = []
    for k in range(1, max(len(t) for t in counts) + 1):
        rows = np.array([t for t in counts if len(t) == k], dtype=np.int64).reshape(-1, k)
        space = TupleSpace(items.sizes, k)
        table = TupleTable(space, space.item_keys(items, rows), [counts[tuple(r)] for r in rows])
        levels.append(Level(k, rows[table.order], table))
    return levels
