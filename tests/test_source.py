"""Contribution bounding: which rows a unit keeps depends on content, never on position."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest

import dpsql
from dpsql.engines.source import bounded_sql
from dpsql.policies import active_policy
from dpsql.policy import Dataset
from dpsql.store import Store

GROUPS = ("a", "b", "c", "d", "e")
UNITS = 60
POLICY = """version: 1
accounting: pure
datasets:
  t:
    table: t
    privacy_unit: person
    max_rows: {max_rows}
    budget: {{epsilon: 1}}
    columns:
      person: {{type: hidden}}
      g: {{type: categorical, values: [a, b, c, d, e, null]}}
      x: {{type: float, bounds: [0, 1], nullable: true}}
users:
  admin: {{role: admin, budgets: {{t: {{epsilon: 1}}}}}}
"""


def _rows() -> list[tuple[int, int, str | None, float | None]]:
    """(pos, person, g, x): units of 1 to 6 rows, shuffled so units interleave, with some
    rows repeated within a unit (ties) and NULLs; ``pos`` is undeclared and not hashed."""
    rng = np.random.default_rng(7)
    rows: list[tuple[int, str | None, float | None]] = []
    for person in range(UNITS):
        own = [(person, rng.choice([*GROUPS, None]), float(rng.integers(0, 3)) / 2)
               for _ in range(1 + person % 6)]
        rows += own + own[:1] * (person % 2)  # odd units repeat their first row
    order = rng.permutation(len(rows))
    return [(pos, *rows[i]) for pos, i in enumerate(order)]


@pytest.fixture(params=[1, 3], ids=["max_rows_1", "max_rows_3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (pos INT, person INT, g VARCHAR, x DOUBLE)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", _rows())
    csv = tmp_path / "t.csv"
    con.execute(f"COPY t TO '{csv}' (HEADER)")
    con.close()
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY.format(max_rows=request.param))
    store, _ = dpsql.init(tmp_path / "s.duckdb", policy, {"t": csv})
    with store.transaction() as cur:
        cur.execute("CREATE TABLE main.t_all AS SELECT * FROM main.t")
    yield store
    store.close()


def _reimport_without(store: Store, person: int | None) -> None:
    """A freshly built table without ``person``'s rows: every later row's rowid shifts."""
    with store.transaction() as cur:
        cur.execute("CREATE OR REPLACE TABLE main.t AS SELECT * FROM main.t_all "
                    "WHERE person IS DISTINCT FROM ? ORDER BY pos", [person])


def _bounded_counts(store: Store, dataset: Dataset, secret: str) -> np.ndarray:
    """The exact (noise-free) bounded COUNT(*) GROUP BY g, NULL as its own group."""
    rows = store.cursor().execute(
        f"SELECT g, count(*) FROM {bounded_sql(dataset, secret)} GROUP BY g").fetchall()
    found = dict(rows)
    return np.array([found.get(g, 0) for g in (*GROUPS, None)])


def test_removing_any_unit_moves_bounded_counts_by_at_most_max_rows(store: Store) -> None:
    dataset = active_policy(store).dataset("t")
    secret = "5ec2e7" * 10 + "beef"  # fixed for every rebuilt table
    _reimport_without(store, None)
    full = _bounded_counts(store, dataset, secret)
    sizes = Counter(person for _, person, _, _ in _rows())
    assert full.sum() == sum(min(n, dataset.max_rows) for n in sizes.values())
    for person in range(UNITS):  # first, last and every one between
        _reimport_without(store, person)
        change = int(np.abs(_bounded_counts(store, dataset, secret) - full).sum())
        assert change <= dataset.max_rows, f"removing unit {person} moved the counts by {change}"


def test_the_choice_depends_on_the_secret(store: Store) -> None:
    dataset = active_policy(store).dataset("t")
    vectors = {tuple(_bounded_counts(store, dataset, s)) for s in ("0" * 64, "1" * 64, "2" * 64)}
    assert len(vectors) > 1


def test_rows_without_a_unit_are_never_used(store: Store) -> None:
    """NULL units bounded together would let one such row displace another's kept row."""
    dataset = active_policy(store).dataset("t")
    secret = "5ec2e7" * 10 + "beef"
    with store.transaction() as cur:
        cur.execute("INSERT INTO main.t_all VALUES (1000, NULL, 'a', 0), (1001, NULL, 'b', 0.5), "
                    "(1002, NULL, 'c', 1), (1003, NULL, 'd', 0), (1004, NULL, 'e', 1)")
    _reimport_without(store, -1)
    full = _bounded_counts(store, dataset, secret)
    for pos in range(1000, 1005):
        with store.transaction() as cur:
            cur.execute("CREATE OR REPLACE TABLE main.t AS SELECT * FROM main.t_all "
                        "WHERE pos <> ? ORDER BY pos", [pos])
        assert (_bounded_counts(store, dataset, secret) == full).all()
