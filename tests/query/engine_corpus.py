"""The query corpus every engine must answer exactly as DuckDB does (no noise).

tests/query/test_postgres.py and tests/query/test_spark.py run it on stores
whose rows live on another engine and compare with a DuckDB store of the same
rows: every construct test_exact.py covers, plus arithmetic, rounding, binning
and FILTER cases whose meaning differs between SQL dialects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import dpsql
from tests.query.test_exact import ACS_CASES, ADULT_CASES, CONSTANT_CASES, ORDERED_CASES

EXTRA_CASES = [
    "SELECT COUNT(*) FROM adult WHERE round(hours_per_week / 2) = 20",  # ties: half away from 0
    "SELECT COUNT(*), SUM(age), AVG(capital_gain) FROM adult WHERE sex = 1 AND age > 30",
    "SELECT race, sex, COUNT(*), AVG(hours_per_week) FROM adult GROUP BY race, sex",
    "SELECT dp_bin(age, 7), SUM(hours_per_week) FROM adult GROUP BY 1",
    "SELECT COUNT(*) FROM adult WHERE age - 2 * hours_per_week > -100 OR NOT (age < 30)",
    "SELECT COUNT(*) FROM adult WHERE round(age / 7) = 4 AND round(age / 3.0, 1) > 9",
    "SELECT relationship, COUNT(*) FILTER (WHERE age BETWEEN 20 AND 30) FROM adult GROUP BY 1",
]
ACS_EXTRA = [
    "SELECT COUNT(*), SUM(pincp) FROM acs WHERE pincp > 1000.5",
    "SELECT sex, SUM(density), COUNT(density) FROM acs GROUP BY sex",
]
#: Every case as (dataset, query); the quick suite runs every fourth.
CORPUS = ([("adult", c[1]) for c in ADULT_CASES] + [("adult", c[1]) for c in ORDERED_CASES]
          + [("adult", c) for c in CONSTANT_CASES] + [("adult", c) for c in EXTRA_CASES]
          + [("acs", c[1]) for c in ACS_CASES] + [("acs", c) for c in ACS_EXTRA])

#: Rows for the bounding tests: units with more rows than max_rows, NULLs, NaN, infinities,
#: integral and fractional floats, non-ASCII text (DuckDB SQL; copied to each engine).
BOUNDED_ROWS = """SELECT i % 97 AS person,
  CASE WHEN i % 11 = 0 THEN 'NaN'::DOUBLE WHEN i % 13 = 0 THEN NULL WHEN i % 17 = 0 THEN 1.0
       WHEN i % 19 = 0 THEN 'Infinity'::DOUBLE ELSE (i % 7) / 3.0 END AS x,
  CASE WHEN i % 5 = 0 THEN NULL ELSE (i % 4)::INTEGER END AS n,
  CASE WHEN i % 3 = 0 THEN 'é' WHEN i % 7 = 0 THEN NULL ELSE 'ab' END AS s
FROM range(2000) r(i)"""


def answers(paths: tuple[Path, Path], sql: str) -> tuple[list[Any], list[Any]]:
    """The exact answers to ``sql`` of two stores (an unbounded budget: no noise)."""
    out = []
    for path in paths:
        with dpsql.connect(path, "alice") as session:
            answer = session.sql(sql)
            assert answer.kind == "dp"  # a repeated measurement comes from the cache
            out.append(answer.table.to_pylist())
    return out[0], out[1]


def check_identical(twins: dict[str, tuple[Path, Path]], dataset: str, sql: str) -> None:
    """The DuckDB store and the other engine's store (``twins[dataset]``) answer alike."""
    on_duckdb, on_engine = answers(twins[dataset], sql)
    assert on_engine == on_duckdb, sql


def record_streams(monkeypatch: pytest.MonkeyPatch, sizes: dict[type, int]
                   ) -> dict[type, list[pa.RecordBatch]]:
    """Keep every batch each engine class streams (with its batch size) as it goes by.

    The engines run for real; this only watches what a release exports and that
    no batch exceeds its size.
    """
    exported: dict[type, list[pa.RecordBatch]] = {engine: [] for engine in sizes}
    for engine, size in sizes.items():
        def recorded(self: Any, query: Any, schema: Any, _: int = 0,
                     stream: Any = engine.stream, size: int = size,
                     seen: list[pa.RecordBatch] = exported[engine]) -> Any:
            for batch in stream(self, query, schema, size):
                assert batch.num_rows <= size
                seen.append(batch)
                yield batch
        monkeypatch.setattr(engine, "stream", recorded)
    return exported


def exported_rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    """The rows of ``batches``, in a fixed order (engines stream in their own)."""
    return sorted(pa.Table.from_batches(batches).to_pylist(), key=repr)
