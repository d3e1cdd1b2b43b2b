"""Fixtures for NAPSU-MQ: a real zCDP store over the bundled Adult sample, binned coarsely."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql import _exact
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.policies import active_policy
from dpsql.store import Store
from tests.conftest import ADULT_SAMPLE

POLICY = """version: 1
accounting: {accounting}
{delta}datasets:
  adult:
    table: adult
    budget: {{epsilon: 10}}
    columns:
      age: {{type: integer, bounds: [0, 84], bins: [0, 17, 34, 51, 68, 84]}}
      sex: {{type: categorical, values: [0, 1]}}
      race: {{type: categorical, values: [0, 1, 2, 3, 4]}}
      income_50k: {{type: categorical, values: [0, 1]}}
      hours_per_week: {{type: integer, bounds: [0, 98], bins: [0, 20, 40, 60, 80, 98]}}
      fnlwgt: {{type: hidden}}
users:
  admin: {{role: admin, budgets: {{adult: {{epsilon: 10}}}}}}
"""


@dataclass
class Source:
    store: Store
    relation: duckdb.DuckDBPyRelation
    domain: Domain


def build(tmp_path: Path, accounting: str = "zcdp") -> Store:
    policy = tmp_path / f"{accounting}.yaml"
    delta = "delta: 1.0e-6\n" if accounting == "zcdp" else ""
    policy.write_text(POLICY.format(accounting=accounting, delta=delta))
    store, _ = dpsql.init(tmp_path / f"{accounting}.duckdb", policy, {"adult": ADULT_SAMPLE})
    return store


@pytest.fixture
def adult(tmp_path: Path) -> Iterator[Source]:
    """The bounded Adult sample (5,000 rows, 5 binned columns) under a zCDP policy."""
    store = build(tmp_path)
    dataset = active_policy(store).datasets["adult"]
    yield Source(store, bounded_relation(store, dataset), Domain.from_dataset(dataset))
    store.close()


class SeededEntropy:
    """Deterministic stand-in for the OS entropy source (tests only)."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def take(self, nbytes: int) -> bytes:
        return self._rng.bytes(nbytes)


@pytest.fixture
def seeded_entropy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the secure samplers reproducible for statistical tests (seeded by the test id)."""
    seed = int.from_bytes(hashlib.sha256(request.node.nodeid.encode()).digest()[:8], "little")
    monkeypatch.setattr(_exact, "ENTROPY", SeededEntropy(seed))
