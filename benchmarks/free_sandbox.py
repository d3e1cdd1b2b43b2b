"""What running free and catalog queries in a sandbox process costs, per query.

Free queries (released and public tables, no-table SELECTs) and SQL clients'
catalog queries run in a sandbox process with a hard memory limit
(``dpsql/sandbox.py``). This times each query below both ways, interleaved,
``--runs`` times, and prints the medians, their ratio and the difference:

- in-process: the free database's file opened read-only in this process (the
  catalog built in an in-memory DuckDB here), a cursor per query, the answer as
  Arrow: what the server did before;
- sandbox: the same SQL through ``FreeCopy.run`` / ``CatalogSource.sql``: a
  pickled request down a pipe, the answer back as an Arrow IPC stream.

The sandbox is started (and has opened the database) before the timing. The
released table has ``--rows`` rows of 6 columns.

    python benchmarks/free_sandbox.py [--runs 300] [--rows 100000] [--json]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from _common import print_table, readme

import dpsql
from dpsql.query.free import FREE as FREE_DATABASE
from dpsql.query.free import FREE_CONFIG
from dpsql.sandbox import SANDBOXES
from dpsql.server import pgcatalog
from dpsql.server.catalog import CATALOG_LIMITS, CatalogSource, relations
from dpsql.services import open_store
from dpsql.store import HARDENED_CONFIG

FREE = {
    "SELECT 1 (no table)": "SELECT 1 AS one",
    "count by 2 columns": "SELECT sex, race, count(*) FROM released.bench GROUP BY ALL",
    "1,000 rows": "SELECT * FROM released.bench LIMIT 1000",
    "whole table": "SELECT * FROM released.bench",
}
CATALOG = {
    "catalog: psql \\dt": (
        "SELECT n.nspname, c.relname, c.relkind FROM pgc.pg_class c "
        "JOIN pgc.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'v') "
        "ORDER BY 1, 2"),
}


def build(folder: Path, rows: int) -> Path:
    """A store with the bundled Adult sample and a released table of ``rows`` rows."""
    data = Path(str(resources.files("dpsql").joinpath("data")))
    path = folder / "bench.duckdb"
    store, _ = dpsql.init(path, data / "adult.yaml", {"adult": data / "adult_sample.csv"})
    with store.transaction() as cur:
        cur.execute(f"CREATE TABLE released.bench AS SELECT i % 85 AS age, i % 2 AS sex, "
                    f"i % 5 AS race, i % 16 AS education_num, (i * 7) % 2 AS income, "
                    f"'row ' || i AS label FROM range({rows}) t(i)")
    store.close()
    return path


def timed(fn: Callable[[], pa.Table]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, open_store(build(Path(tmp), args.rows)) as store:
        free = store[FREE_DATABASE]
        source = CatalogSource(store)
        local_catalog = duckdb.connect(":memory:", config={**HARDENED_CONFIG, **CATALOG_LIMITS})
        pgcatalog.build_shared(local_catalog, relations(store))
        with free.using(store) as copy:
            local = duckdb.connect(str(copy.path), read_only=True, config=dict(FREE_CONFIG))
            cases: dict[str, tuple[Callable[[], pa.Table], Callable[[], pa.Table]]] = {}
            for name, sql in FREE.items():
                cases[name] = (_local(local, sql), functools.partial(copy.run, sql, user="bench"))
            for name, sql in CATALOG.items():
                cases[name] = (_local(local_catalog, sql), functools.partial(source.sql, sql))
            for inside, sandboxed in cases.values():  # warm: the sandbox opens both databases
                inside(), sandboxed()
            results: list[dict[str, Any]] = []
            for name, (inside, sandboxed) in cases.items():
                times: tuple[list[float], list[float]] = ([], [])
                for _ in range(args.runs):
                    times[0].append(timed(inside))
                    times[1].append(timed(sandboxed))
                a, b = statistics.median(times[0]), statistics.median(times[1])
                results.append({"query": name, "in-process ms": a * 1000,
                                "sandbox ms": b * 1000, "ratio": b / a,
                                "added ms": (b - a) * 1000})
            local.close()
        local_catalog.close()
        print(f"{args.runs} runs each, interleaved; released table of {args.rows:,} rows; "
              f"{len(store[SANDBOXES].pids())} sandbox(es); load average "
              f"{os.getloadavg()[0]:.2f}")
        print_table(results, args.json)
        added = statistics.median(r["added ms"] for r in results)
        ratios = ", ".join(f"{r['query']} {r['ratio']:.2f}x" for r in results)
        readme(f"a free query in a sandbox: +{added:.2f} ms median over these queries "
               f"({ratios})")


def _local(con: duckdb.DuckDBPyConnection, sql: str) -> Callable[[], pa.Table]:
    def run() -> pa.Table:
        cursor = con.cursor()
        try:
            return cursor.sql(sql).to_arrow_table()
        finally:
            cursor.close()
    return run


if __name__ == "__main__":
    main()
