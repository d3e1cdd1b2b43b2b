"""Overhead of a DP SQL answer on Spark over the plain Spark query, on generated Parquet rows.

``--rows`` rows (age, sex, hours, income) are generated with DuckDB into one
Parquet file; a store's dataset reads it on Spark (``engine: {kind: spark,
path: ...}``, master ``--master``). Two queries, COUNT GROUP BY and a filtered
SUM, run end to end through ``Session.sql`` (parse, plan, charge, bounded Spark
SQL, noise) and as the plain Spark SQL query on the same file and session,
interleaved, median of ``--runs`` each (a fresh epsilon each run: never the
answer cache). ``--unit-rows N`` adds a privacy unit of N consecutive rows
(``max_rows: 1``), so the dpsql runs pay for contribution bounding (the portable
md5 key) too. The host's load average is printed with the figures.

``--release N [N ...]`` measures instead an ``independent`` release (age, sex,
hours) of N generated rows, each size in a fresh process: its wall time, the
peak RSS of the dpsql process (the driver's Python side, which streams the
bounded source's contingency table over the domain from Spark in Arrow batches
into the release's folder), of the Spark JVM (driver and ``local`` executors)
and of the release's worker process (which fits on those counts expanded back
to rows).

    python benchmarks/spark_engine.py [--rows 1000000] [--runs 5] [--unit-rows 0]
        [--master local[2]] [--release 1000000 10000000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import yaml
from _common import median_time, peak_rss_mb, print_table

import dpsql
from dpsql.engines.spark import session
from dpsql.policy import Policy

QUERIES = {
    "count group by": ("SELECT sex, COUNT(*) FROM t GROUP BY sex",
                       "SELECT sex, COUNT(*) FROM {table} GROUP BY sex"),
    "filtered sum": ("SELECT SUM(hours) FROM t WHERE age BETWEEN 20 AND 40",
                     "SELECT SUM(hours) FROM {table} WHERE age BETWEEN 20 AND 40"),
}


def generate(rows: int, unit_rows: int, path: Path) -> None:
    """``rows`` pseudo-random rows (a fixed hash of the row number) as Parquet."""
    unit = f"i // {unit_rows}" if unit_rows else "i"
    duckdb.sql(f"""COPY (SELECT {unit} AS person, CAST(17 + hash(i) % 74 AS INTEGER) AS age,
        CASE WHEN hash(i + 1) % 2 = 0 THEN 'F' ELSE 'M' END AS sex,
        CAST(1 + hash(i + 2) % 99 AS INTEGER) AS hours, (hash(i + 3) % 100000) / 1.5 AS income
        FROM range({rows}) r(i)) TO '{path}' (FORMAT parquet)""")


def policy(path: Path, unit_rows: int, master: str) -> str:
    """A policy whose dataset ``t`` reads ``path`` on Spark."""
    dataset = {
        "table": "t", "budget": {"epsilon": 1_000_000}, "default_query": {"epsilon": 1},
        "engine": {"kind": "spark", "path": str(path), "master": master},
        "columns": {"person": {"type": "hidden"},
                    "age": {"type": "integer", "bounds": [0, 120], "bins": 10},
                    "sex": {"type": "categorical", "values": ["F", "M"]},
                    "hours": {"type": "integer", "bounds": [0, 99], "bins": 10},
                    "income": {"type": "float", "bounds": [0, 100000]}},
    }
    if unit_rows:
        dataset.update(privacy_unit="person", max_rows=1)
    dataset["synthesizers"] = ["independent"]
    return yaml.safe_dump({"version": 1, "accounting": "pure", "datasets": {"t": dataset},
                           "users": {"admin": {"role": "admin",
                                               "budgets": {"t": {"epsilon": 1_000_000}}}}})


def release_once(rows: int, unit_rows: int, master: str) -> dict[str, float]:
    """One ``independent`` release of ``rows`` generated rows: time and peak memories (MB)."""
    with tempfile.TemporaryDirectory() as tmp:
        data, store = Path(tmp) / "t.parquet", Path(tmp) / "t.duckdb"
        generate(rows, unit_rows, data)
        (Path(tmp) / "p.yaml").write_text(policy(data, unit_rows, master))
        dpsql.init(store, Path(tmp) / "p.yaml")[0].close()  # starts Spark: the schema check
        with dpsql.connect(store, "admin") as admin:
            start = time.perf_counter()
            admin.release("t", synthesizer="independent", name="r", epsilon=1, rows=1000,
                          columns=["age", "sex", "hours"])
            seconds = time.perf_counter() - start
        jvm = session(Policy.from_text(policy(data, unit_rows, master)).dataset("t").engine
                      ).sparkContext._gateway.proc.pid  # type: ignore[union-attr]
        status = Path(f"/proc/{jvm}/status").read_text()
        jvm_mb = int(status.split("VmHWM:")[1].split()[0]) / 1024
    worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"rows": rows, "release s": seconds, "dpsql process MB": peak_rss_mb(),
            "Spark JVM MB": jvm_mb, "worker MB": worker}


def releases(sizes: list[int], unit_rows: int, master: str) -> None:
    """:func:`release_once` for each size, each in a fresh process (peaks are per process)."""
    results = []
    for rows in sizes:
        out = subprocess.run([sys.executable, __file__, "--release-one", str(rows),
                              "--unit-rows", str(unit_rows), "--master", master],
                             check=True, stdout=subprocess.PIPE, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    print(f"independent release (age, sex, hours), unit rows {unit_rows or 'none'}, master "
          f"{master}, load {os.getloadavg()[0]:.1f}")
    print_table(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--unit-rows", type=int, default=0)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--release", type=int, nargs="+", metavar="N")
    parser.add_argument("--release-one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.release_one:
        print(json.dumps(release_once(args.release_one, args.unit_rows, args.master)))
        return
    if args.release:
        releases(args.release, args.unit_rows, args.master)
        return
    with tempfile.TemporaryDirectory() as tmp:
        data, store = Path(tmp) / "t.parquet", Path(tmp) / "t.duckdb"
        generate(args.rows, args.unit_rows, data)
        text = policy(data, args.unit_rows, args.master)
        (Path(tmp) / "p.yaml").write_text(text)
        dpsql.init(store, Path(tmp) / "p.yaml")[0].close()
        spec = Policy.from_text(text).dataset("t").engine
        assert spec is not None
        spark = session(spec)
        spark.sparkContext.setLogLevel("ERROR")
        spark.read.parquet(str(data)).createOrReplaceTempView("plain")
        counter = itertools.count(1)
        rows = []
        with dpsql.connect(store, "admin") as admin:
            for name, (dp_sql, plain_sql) in QUERIES.items():
                def dp(sql: str = dp_sql) -> None:  # a new epsilon: never the cache
                    admin.sql(f"SET dpsql.epsilon = {1 + next(counter) / 10**6}")
                    admin.sql(sql)

                def plain(sql: str = plain_sql.format(table="plain")) -> None:
                    spark.sql(sql).toArrow()

                dp(), plain()  # warm up: JIT, file listing
                dp_times, plain_times = [], []
                for _ in range(args.runs):  # interleaved: the host's load hits both alike
                    dp_times.append(median_time(dp, 1)[0])
                    plain_times.append(median_time(plain, 1)[0])
                dp_median = sorted(dp_times)[len(dp_times) // 2]
                plain_median = sorted(plain_times)[len(plain_times) // 2]
                rows.append({"query": name, "plain spark s": plain_median,
                             "dpsql s": dp_median, "ratio": dp_median / plain_median})
    print(f"{args.rows:,} rows, unit rows {args.unit_rows or 'none'}, master {args.master}, "
          f"median of {args.runs}, load {os.getloadavg()[0]:.1f}")
    print_table(rows)


if __name__ == "__main__":
    main()
