"""Overhead of a DP SQL answer over the plain DuckDB query, on 10 million rows.

The Adult sample is replicated to ``--rows`` rows in a governed store. Two
queries run end to end through ``Session.sql`` (parse, plan, charge, bounded
SQL, noise, cache write, post-processing) and as the plain DuckDB query on the
same connection, interleaved, median of ``--runs`` each. Every dpsql run uses a
fresh epsilon so the answer cache never serves it; the rows marked "(new text)"
also change the text each run (extra blanks), so no plan is reused. The table
is imported with ``enforce_bounds`` (the policy's bounds become CHECK
constraints, so no value is clamped in SQL) and grown in place;
``--no-checks`` imports it without them (every value clamped). If smartnoise-sql is
installed in /work/venvs/smartnoise, the same queries run through its pandas
reader (in that venv, on the same rows) and its ratio to plain DuckDB is
printed too. ``--unit-rows N`` adds a privacy unit of N consecutive rows
(``max_rows: 1``), so the dpsql runs pay for contribution bounding too.

    python benchmarks/query_overhead.py [--rows 10000000] [--runs 8] [--unit-rows 4]
        [--queries "sum with BETWEEN"] [--store FOLDER] [--json]

``--store FOLDER`` keeps the built store there and reuses it on the next run
(the same ``--rows``, ``--no-checks`` and ``--unit-rows``: they are not checked).

The host's load average is printed beside each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.csv as pacsv
import yaml
from _common import median_time, peak_rss_mb, print_table, readme, span

import dpsql
from dpsql.ledger.books import settled
from dpsql.services import open_store

# name -> the DP query, and the plain query it is timed against when they differ.
QUERIES = {
    "count by 2 categoricals": "SELECT sex, race, COUNT(*) FROM adult GROUP BY sex, race",
    "sum with BETWEEN": "SELECT SUM(capital_gain) FROM adult WHERE age BETWEEN 20 AND 40",
    "avg with BETWEEN": "SELECT AVG(hours_per_week) FROM adult WHERE age BETWEEN 20 AND 40",
    "avg by dp_bin": "SELECT dp_bin(age, 10) AS a, AVG(hours_per_week) FROM adult GROUP BY a",
    "variance by sex": "SELECT sex, VAR_POP(age), STDDEV_SAMP(capital_gain) FROM adult "
                       "GROUP BY sex",
}
PLAIN = {"avg by dp_bin": "SELECT 10 * floor(age / 10) AS a, AVG(hours_per_week) FROM adult "
                          "GROUP BY a"}
SMARTNOISE = Path("/work/venvs/smartnoise/bin/python")
SMARTNOISE_QUERIES = ("count by 2 categoricals", "sum with BETWEEN")  # on its CSV's columns
SAMPLE_ROWS = 5000


def build(directory: Path, rows: int, checks: bool = True, unit_rows: int = 0,
          accounting: str = "zcdp") -> Path:
    data = Path(str(resources.files("dpsql").joinpath("data")))
    raw = yaml.safe_load((data / "adult.yaml").read_text())
    raw["accounting"] = accounting
    if accounting == "pure":
        del raw["delta"]
    big = {"epsilon": 1_000_000}
    raw["datasets"]["adult"].update(budget=big, query_cap={"epsilon": 10},
                                    default_query={"epsilon": 1})
    sample, person = data / "adult_sample.csv", ""
    if unit_rows:
        sample = directory / "adult_units.csv"
        duckdb.sql(f"COPY (SELECT *, (row_number() OVER () - 1) // {unit_rows} AS person "
                   f"FROM '{data / 'adult_sample.csv'}') TO '{sample}' (HEADER)")
        raw["datasets"]["adult"]["columns"]["person"] = {"type": "hidden"}
        raw["datasets"]["adult"].update(privacy_unit="person", max_rows=1)
        person = f" REPLACE (a.person + {SAMPLE_ROWS} * (r.range + 1) AS person)"
    for user in raw["users"].values():
        user["budgets"] = {"adult": big}
    policy = directory / "policy.yaml"
    policy.write_text(yaml.safe_dump(raw))
    path = directory / "big.duckdb"
    store, _ = dpsql.init(path, policy, {"adult": sample}, enforce_bounds=checks)
    copies = -(-rows // SAMPLE_ROWS)
    with store.transaction() as cur:
        cur.execute(f"INSERT INTO main.adult SELECT a.*{person} FROM main.adult a, "
                    f"range({copies - 1}) r LIMIT {rows - SAMPLE_ROWS}")
    store.close()
    return path


def smartnoise(path: Path, runs: int) -> dict[str, float] | None:
    """Median seconds per query through smartnoise-sql's pandas reader, or None."""
    if not SMARTNOISE.exists():
        return None
    csv = path.with_suffix(".csv")
    with open_store(path) as store:
        table = store.cursor().sql("SELECT sex, race, age, capital_gain FROM main.adult") \
            .to_arrow_table()
    pacsv.write_csv(table, csv)
    script = Path(__file__).with_name("_smartnoise_queries.py")
    result = subprocess.run([str(SMARTNOISE), str(script), str(csv), str(runs),
                             json.dumps({q: QUERIES[q] for q in SMARTNOISE_QUERIES})],
                            capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                            timeout=3600)
    if result.returncode != 0:
        print("smartnoise-sql failed:", result.stderr.strip().splitlines()[-1:])
        return None
    return dict(json.loads(result.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--queries", nargs="*", choices=list(QUERIES), default=list(QUERIES),
                        help="which queries to time (default: all)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--store", type=Path,
                        help="reuse the store this run builds in this folder (built if absent)")
    parser.add_argument("--no-smartnoise", action="store_true")
    parser.add_argument("--no-checks", action="store_true",
                        help="import without enforcing the bounds, so every value is clamped")
    parser.add_argument("--unit-rows", type=int, default=0,
                        help="one privacy unit per N consecutive rows (max_rows 1); 0: none")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpsql-bench-") as tmp:
        folder = args.store or Path(tmp)
        path = folder / "big.duckdb"
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            build(folder, args.rows, checks=not args.no_checks, unit_rows=args.unit_rows)
        rows = []
        with dpsql.connect(path, "alice") as session:
            cursor = session.store.cursor()
            counter = iter(range(10**6))
            # a kept store holds earlier runs' answers: start this run's epsilons elsewhere
            epsilons = iter(range(random.randrange(8 * 10**6), 10**7))

            def fresh() -> None:  # a new epsilon: a new measurement, never the cache
                session.sql(f"SET dpsql.epsilon = {1 + next(epsilons) / 10**6}")

            def dp(sql: str) -> None:
                answer = session.sql(sql)
                assert not answer.cached

            def plain(sql: str) -> None:
                cursor.sql(sql).fetchall()

            def quiet() -> None:  # the settle queued after an answer never overlaps a timing
                settled(session.store)

            def text(sql: str, new: bool) -> str:  # extra blanks: a text never planned
                return sql.replace("SELECT ", "SELECT " + " " * next(counter), 1) if new else sql

            for name in args.queries:
                sql, plain_sql = QUERIES[name], PLAIN.get(name, QUERIES[name])
                fresh()
                dp(sql)
                plain(plain_sql)  # warm both
                for new in (False, True):
                    dp_times, plain_times = [], []
                    for _ in range(args.runs):  # interleaved, so drift hits both alike
                        fresh()
                        quiet()
                        asked = text(sql, new)
                        dp_times.append(median_time(lambda s=asked: dp(s), 1)[0])
                        quiet()
                        plain_times.append(median_time(lambda s=plain_sql: plain(s), 1)[0])
                    dp_median = sorted(dp_times)[len(dp_times) // 2]
                    plain_median = sorted(plain_times)[len(plain_times) // 2]
                    rows.append({"query": name + (" (new text)" if new else ""),
                                 "rows": args.rows, "dpsql_s": dp_median,
                                 "duckdb_s": plain_median, "ratio": dp_median / plain_median,
                                 "load": os.getloadavg()[0]})
        sn = None if args.no_smartnoise else smartnoise(path, args.runs)
        if sn is not None:
            for row in rows:
                query = row["query"].removesuffix(" (new text)")
                row["smartnoise_s"] = sn.get(query, "-")  # a table needs every column
                row["smartnoise_ratio"] = sn[query] / row["duckdb_s"] if query in sn else "-"
        print_table(rows, args.json)
        if not args.json:
            print(f"median of {args.runs} runs each; peak RSS {peak_rss_mb():.0f} MB"
                  + ("" if sn is not None else "; smartnoise-sql not run"))
            readme_line(rows, args)


def readme_line(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The README's figures: each query's ratio, then with a text never seen before."""
    ratio = {r["query"]: f"{r['ratio']:.2f}x" for r in rows}
    bounds = "without --enforce-bounds" if args.no_checks else "with --enforce-bounds"
    units = f", a privacy unit per {args.unit_rows} rows" if args.unit_rows else ""
    asked = "; ".join(f"{q} {ratio[q]} (new text {ratio[q + ' (new text)']})"
                      for q in args.queries)
    sn = [f"{r['query']} {r['smartnoise_ratio']:.0f}x" for r in rows
          if r.get("smartnoise_ratio", "-") != "-" and "(new text)" not in r["query"]]
    smartnoise = "smartnoise-sql " + ", ".join(sn) if sn else "smartnoise-sql not run"
    loads = span((r["load"] for r in rows), ".1f")
    readme(f"{args.rows:,} rows, median of {args.runs} runs{units}, {bounds}: {asked}; "
           f"{smartnoise}; load {loads}")


if __name__ == "__main__":
    main()
