"""Where the fixed cost of one DP answer goes: a median per part, beside the plain query.

Times one query of ``query_overhead.py`` end to end through ``Session.sql`` and,
in the same runs, the parts of it that cost a fixed time whatever the rows: the
column types and the CHECK bounds read from the catalog, the plan (new text
only), the bind, the durable charge, the aggregation itself and the settle.
``fsync`` is one 300-byte append and fsync beside the store, the floor of any
durable commit on this disk. The store is the one ``query_overhead.py --store``
keeps (built here when absent).

    python benchmarks/answer_parts.py --store /tmp/ovh [--rows 10000000] [--runs 40]
        [--query "sum with BETWEEN"] [--new-text]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from query_overhead import QUERIES, build

import dpsql
from dpsql.engines.local import DuckDBEngine, _DuckDBPrepared
from dpsql.ledger import Ledger
from dpsql.ledger.books import settled
from dpsql.query import dp

PARTS: list[tuple[Any, str, str]] = [
    (DuckDBEngine, "column_types", "types"), (DuckDBEngine, "enforced_bounds", "bounds"),
    (dp, "planned", "plan"), (DuckDBEngine, "prepare", "bind"),
    (Ledger, "charge", "charge"), (_DuckDBPrepared, "run", "aggregate"),
    (Ledger, "settle", "settle"),
]


def timed(spans: dict[str, list[float]], label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spans.setdefault(label, []).append(time.perf_counter() - start)
    return wrapper


def fsync_once(path: Path) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        start = time.perf_counter()
        os.write(fd, b"x" * 300)
        os.fsync(fd)
        return time.perf_counter() - start
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--query", choices=list(QUERIES), default="sum with BETWEEN")
    parser.add_argument("--new-text", action="store_true", help="a text never planned each run")
    args = parser.parse_args()
    path = args.store / "big.duckdb"
    if not path.exists():
        args.store.mkdir(parents=True, exist_ok=True)
        build(args.store, args.rows)
    spans: dict[str, list[float]] = {}
    for owner, name, label in PARTS:
        setattr(owner, name, timed(spans, label, getattr(owner, name)))
    sql = QUERIES[args.query]
    with dpsql.connect(path, "alice") as session:
        cursor = session.store.cursor()
        for run in range(args.runs + 1):
            session.sql(f"SET dpsql.epsilon = {1 + (run + time.time() % 1000) / 10**6}")
            settled(session.store)
            asked = sql.replace("SELECT ", "SELECT " + " " * run, 1) if args.new_text else sql
            start = time.perf_counter()
            assert not session.sql(asked).cached
            spans.setdefault("dpsql total", []).append(time.perf_counter() - start)
            settled(session.store)
            start = time.perf_counter()
            cursor.sql(sql).fetchall()
            spans.setdefault("plain DuckDB", []).append(time.perf_counter() - start)
            spans.setdefault("fsync", []).append(fsync_once(args.store / "fsync.probe"))
            if run == 0:  # warm-up
                spans.clear()
    ms = {label: statistics.median(values) * 1000 for label, values in spans.items()}
    for label, value in ms.items():
        print(f"{label:14s} {value:7.3f} ms")
    parts = sum(ms.get(label, 0.0) for _, _, label in PARTS)
    print(f"ratio {ms['dpsql total'] / ms['plain DuckDB']:.2f}x; rest (parse, cache look-up, "
          f"noise, reply) {ms['dpsql total'] - parts:.2f} ms; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
