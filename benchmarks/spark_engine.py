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

    python benchmarks/spark_engine.py [--rows 1000000] [--runs 5] [--unit-rows 0]
        [--master local[2]]
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
from pathlib import Path

import duckdb
import yaml
from _common import median_time, print_table

import dpsql
from dpsql.policy import Policy
from dpsql.query.spark import session

QUERIES = {
    "count group by": ("SELECT sex, COUNT(*) FROM t GROUP BY sex",
                       "SELECT sex, COUNT(*) FROM {table} GROUP BY sex"),
    "filtered sum": ("SELECT SUM(hours) FROM t WHERE age BETWEEN 20 AND 40",
                     "SELECT SUM(hours) FROM {table} WHERE age BETWEEN 20 AND 40"),
}


def generate(rows: int, unit_rows: int, path: Path) -> None:
    """``rows`` pseudo-random rows (a fixed hash of the row number) as Parquet."""
    unit = f"i // {unit_rows}" if unit_rows else "i"
    duckdb.sql(f"""COPY (SELECT {unit} AS person, 17 + hash(i) % 74 AS age,
        CASE WHEN hash(i + 1) % 2 = 0 THEN 'F' ELSE 'M' END AS sex,
        1 + hash(i + 2) % 99 AS hours, (hash(i + 3) % 100000) / 1.5 AS income
        FROM range({rows}) r(i)) TO '{path}' (FORMAT parquet)""")


def policy(path: Path, unit_rows: int, master: str) -> str:
    """A policy whose dataset ``t`` reads ``path`` on Spark."""
    dataset = {
        "table": "t", "budget": {"epsilon": 1_000_000}, "default_query": {"epsilon": 1},
        "engine": {"kind": "spark", "path": str(path), "master": master},
        "columns": {"person": {"type": "hidden"},
                    "age": {"type": "integer", "bounds": [0, 120]},
                    "sex": {"type": "categorical", "values": ["F", "M"]},
                    "hours": {"type": "integer", "bounds": [0, 99]},
                    "income": {"type": "float", "bounds": [0, 100000]}},
    }
    if unit_rows:
        dataset.update(privacy_unit="person", max_rows=1)
    return yaml.safe_dump({"version": 1, "accounting": "pure", "datasets": {"t": dataset},
                           "users": {"admin": {"role": "admin",
                                               "budgets": {"t": {"epsilon": 1_000_000}}}}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--unit-rows", type=int, default=0)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
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
