"""DP quantiles in SQL: accuracy against OpenDP's quantile; overhead over plain DuckDB.

Accuracy: on columns of the full Adult data (shared/data/adult, integer codes) and
of the ACS excerpt (shared/data/acs/national2019.csv: AGEP, EDU),
dpsql's quantile mechanism (the code ``SELECT MEDIAN(col)`` runs after the
database returns its histogram, over the same integer grid as the policy's
bounds) and OpenDP 0.16's ``make_private_quantile`` (same candidates, same q,
its scale found by ``binary_search_param`` for pure epsilon under add/remove of
one row) each answer ``--reps`` times; the table gives the median and 90th
percentile of the absolute error against the true quantile (DuckDB's
``quantile_disc``), on the whole column and on a seeded 1,000-row subsample.
Overhead: ``SELECT MEDIAN(age)``, a grouped ``QUANTILE_CONT`` and ``COUNT(DISTINCT)``
(whole and grouped) end to end
through ``Session.sql`` (fresh epsilon each run, so no cached answer;
``COUNT(*)`` shows dpsql's fixed overhead) against the same plain DuckDB query,
on ``--rows`` rows (the Adult sample replicated as in ``query_overhead.py``),
median of ``--runs``.
SmartNoise SQL: each new aggregate on ``age`` of the 5,000-row Adult sample at
epsilon 1 (dpsql: zCDP at delta 1e-6; smartnoise-sql: Privacy(1, 1e-6), same
bounds [0, 84]), ``--reps`` answers each; median and p90 absolute error against
plain DuckDB, or the message with which smartnoise-sql refuses the query. It
runs when smartnoise-sql is installed in /work/venvs/smartnoise (as for
``query_overhead.py``).

    python benchmarks/sql_breadth.py [--rows 10000000] [--reps 100] [--runs 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow.csv as pacsv
from _common import median_time, print_table, readme, shared_data
from query_overhead import SAMPLE_ROWS, SMARTNOISE, build

import dpsql
from dpsql.privacy import PrivacyCost
from dpsql.query.quantile import Grid, QuantileNoise
from dpsql.services import open_store

COLUMNS = {  # (data set, column): bounds [0, hi]
    ("adult", "age"): 84, ("adult", "hours-per-week"): 98, ("adult", "education-num"): 15,
    ("acs", "AGEP"): 99, ("acs", "EDU"): 12}
QS = (Fraction(1, 2), Fraction(9, 10), Fraction(1, 100))
EPSILONS = (Fraction(1, 100), Fraction(1, 10), Fraction(1))
SUBSAMPLE = 1000  # rows of a seeded subsample, where the noise shows
OVERHEAD = {
    "count (reference)": ("SELECT COUNT(*) FROM adult", "SELECT count(*) FROM main.adult"),
    "median": ("SELECT MEDIAN(age) FROM adult", "SELECT median(age) FROM main.adult"),
    "p90 by sex, race": ("SELECT sex, race, QUANTILE_CONT(hours_per_week, 0.9) FROM adult "
                         "GROUP BY sex, race", "SELECT sex, race, quantile_cont(hours_per_week,"
                         " 0.9) FROM main.adult GROUP BY sex, race"),
    "count distinct": ("SELECT COUNT(DISTINCT age) FROM adult",
                       "SELECT count(DISTINCT age) FROM main.adult"),
    "count distinct by sex, race": ("SELECT sex, race, COUNT(DISTINCT hours_per_week) FROM adult "
                                    "GROUP BY sex, race", "SELECT sex, race, count(DISTINCT "
                                    "hours_per_week) FROM main.adult GROUP BY sex, race"),
}


def data_column(dataset: str, name: str) -> np.ndarray:
    """A column of the full Adult or ACS national2019 file (ACS: "N" is missing, dropped)."""
    path = shared_data(dataset, "adult.csv" if dataset == "adult" else "national2019.csv")
    return duckdb.sql(f"SELECT \"{name}\" FROM read_csv('{path}', nullstr = 'N') "
                      f"WHERE \"{name}\" IS NOT NULL").fetchnumpy()[name]


def dpsql_answers(values: np.ndarray, hi: int, q: Fraction, epsilon: Fraction,
                  reps: int) -> np.ndarray:
    grid = Grid(Fraction(0), Fraction(hi), hi)
    noise = QuantileNoise.calibrate("pure", 1, q, grid, PrivacyCost.pure(epsilon), "bench")
    positions, counts = np.unique(np.clip(values, 0, hi), return_counts=True)
    return grid.values(noise.release([(positions, counts)] * reps))


def opendp_answers(values: np.ndarray, hi: int, q: Fraction, epsilon: Fraction,
                   reps: int) -> np.ndarray:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T=int))

    def make(scale: float) -> Any:
        return dp.m.make_private_quantile(domain, dp.symmetric_distance(), dp.max_divergence(),
                                          candidates=list(range(hi + 1)), alpha=float(q),
                                          scale=scale)

    scale = dp.binary_search_param(make, d_in=1, d_out=float(epsilon))
    measurement = make(scale)
    data = [int(v) for v in np.clip(values, 0, hi)]
    return np.array([measurement(data) for _ in range(reps)], dtype=np.float64)


def accuracy(reps: int, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for (dataset, name), hi in COLUMNS.items():
        full = data_column(dataset, name)
        small = np.random.default_rng(0).choice(full, SUBSAMPLE, replace=False)
        for values in (small,) if quick else (full, small):
            rows += _accuracy_rows(f"{dataset}.{name}", hi, values, reps)
    return rows


def _accuracy_rows(name: str, hi: int, values: np.ndarray, reps: int) -> list[dict[str, Any]]:
    rows = []
    for q in QS:
        truth = float(np.quantile(np.clip(values, 0, hi), float(q), method="inverted_cdf"))
        for epsilon in EPSILONS:
            row: dict[str, Any] = {"column": name, "n": values.size, "q": float(q),
                                   "epsilon": float(epsilon), "truth": truth}
            for who, answers in (("dpsql", dpsql_answers), ("opendp", opendp_answers)):
                errors = np.abs(answers(values, hi, q, epsilon, reps) - truth)
                row[f"{who}_median"] = float(np.median(errors))
                row[f"{who}_p90"] = float(np.quantile(errors, 0.9))
            rows.append(row)
    return rows


def overhead(rows: int, runs: int) -> list[dict[str, Any]]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = build(Path(tmp), rows)
        with dpsql.connect(path, "alice") as alice:
            cursor = alice.store.cursor()
            fresh = iter(range(1, 10**6))
            for name, (dp_sql, plain_sql) in OVERHEAD.items():

                def dp_run(sql: str = dp_sql) -> None:
                    alice.sql(f"SET dpsql.epsilon = {next(fresh) / 10**6}")
                    alice.sql(sql)

                def plain_run(sql: str = plain_sql) -> None:
                    cursor.execute(sql).fetchall()

                dp_run()  # plans and binds the text once
                dp_time, _ = median_time(dp_run, runs)
                plain_time, _ = median_time(plain_run, runs)
                out.append({"query": name, "rows": rows, "dpsql_s": dp_time,
                            "duckdb_s": plain_time, "ratio": dp_time / plain_time})
    return out


VERSUS_SMARTNOISE = {  # name: (dpsql SQL, smartnoise-sql SQL, plain DuckDB SQL)
    name: (f"SELECT {sql} FROM adult", f"SELECT {theirs or sql} FROM adult",
           f"SELECT {plain or sql} FROM main.adult")
    for name, sql, theirs, plain in (
        ("median", "MEDIAN(age)", None, "quantile_disc(age, 0.5)"),
        ("p90", "PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age)", None,
         "quantile_disc(age, 0.9)"),
        ("min", "MIN(age)", None, None), ("max", "MAX(age)", None, None),
        ("variance", "VAR_SAMP(age)", "VAR(age)", None), ("stddev", "STDDEV(age)", None, None),
        ("count distinct", "COUNT(DISTINCT age)", None, None))}


def versus_smartnoise(reps: int) -> list[dict[str, Any]]:
    """Absolute errors of dpsql (zCDP and pure) and smartnoise-sql, same queries, epsilon 1."""
    with tempfile.TemporaryDirectory() as tmp:
        mine, truth = {}, {}
        for accounting in ("zcdp", "pure"):
            (Path(tmp) / accounting).mkdir()
            path = build(Path(tmp) / accounting, SAMPLE_ROWS, accounting=accounting)
            mine[accounting], truth = _answers(path, reps)
        csv = Path(tmp) / "age.csv"
        with open_store(path) as store:
            pacsv.write_csv(store.cursor().sql("SELECT age FROM main.adult").to_arrow_table(), csv)
        theirs = smartnoise_answers(csv, reps)
    rows = []
    for name in VERSUS_SMARTNOISE:
        row: dict[str, Any] = {"query": name, "truth": truth[name]}
        got = theirs.get(name)
        for who, values in (("zcdp", mine["zcdp"][name]), ("pure", mine["pure"][name]),
                            ("smartnoise", got)):
            errors = np.abs(np.array(values) - truth[name]) if isinstance(values, list) \
                else np.array([np.nan])
            row[f"{who}_median"] = float(np.median(errors))
            row[f"{who}_p90"] = float(np.quantile(errors, 0.9))
        row["smartnoise_refused"] = "not run" if got is None else \
            got["refused"] if isinstance(got, dict) else ""
        rows.append(row)
    return rows


def _answers(path: Path, reps: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """dpsql's ``reps`` answers to each query at epsilon 1 (fresh, not cached), and the truth."""
    fresh = iter(range(1, 10**6))
    with dpsql.connect(path, "alice") as alice:
        cursor = alice.store.cursor()
        truth = {name: float(cursor.execute(plain).fetchone()[0])
                 for name, (_, _, plain) in VERSUS_SMARTNOISE.items()}
        answers: dict[str, list[float]] = {}
        for name, (sql, _, _) in VERSUS_SMARTNOISE.items():
            answers[name] = []
            for _ in range(reps):  # a new epsilon each time: no answer from the cache
                alice.sql(f"SET dpsql.epsilon = {1 - next(fresh) / 10**9}")
                answers[name].append(float(alice.sql(sql).table.column(0)[0].as_py()))
    return answers, truth


def smartnoise_answers(csv: Path, reps: int) -> dict[str, Any]:
    """smartnoise-sql's answers (or refusals) per query; empty when it is not installed."""
    if not SMARTNOISE.exists():
        return {}
    script = Path(__file__).with_name("_smartnoise_queries.py")
    queries = {name: sql for name, (_, sql, _) in VERSUS_SMARTNOISE.items()}
    result = subprocess.run([str(SMARTNOISE), str(script), str(csv), str(reps),
                             json.dumps(queries), "answers"], capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                            timeout=3600)
    if result.returncode != 0:
        print("smartnoise-sql failed:", result.stderr.strip().splitlines()[-1:])
        return {}
    return dict(json.loads(result.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="the subsample only, 10 reps, 100,000 rows, 3 runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.reps, args.runs = 100_000, 10, 3
    table = accuracy(args.reps, args.quick)
    print_table(table, args.json)
    small = [r for r in table if r["n"] == SUBSAMPLE and r["epsilon"] == 0.1]
    readme(f"DP quantile abs. error, {SUBSAMPLE} Adult and ACS rows, eps 0.1 (dpsql/OpenDP, "
           "median and p90 of runs): " + ", ".join(
               f"{r['column']} q={r['q']:g} {r['dpsql_median']:g}/{r['opendp_median']:g} "
               f"p90 {r['dpsql_p90']:g}/{r['opendp_p90']:g}" for r in small))
    versus = versus_smartnoise(args.reps)
    print_table(versus, args.json)
    readme(f"DP aggregates vs smartnoise-sql, {SAMPLE_ROWS:,} Adult rows, age, eps 1 "
           "(abs. error dpsql zCDP/dpsql pure/smartnoise, median and p90): " + ", ".join(
               f"{r['query']} {r['zcdp_median']:.3g}/{r['pure_median']:.3g}/" + (
                   f"{r['smartnoise_median']:.3g} p90 {r['zcdp_p90']:.3g}/{r['pure_p90']:.3g}/"
                   f"{r['smartnoise_p90']:.3g}" if not r["smartnoise_refused"]
                   else "not run" if r["smartnoise_refused"] == "not run"
                   else f"refused ({r['smartnoise_refused'][:40]})") for r in versus))
    costs = overhead(args.rows, args.runs)
    print_table(costs, args.json)
    readme(f"DP quantile and distinct count overhead on {args.rows:,} rows: " + ", ".join(
        f"{r['query']} {r['ratio']:.2f}x ({r['dpsql_s'] * 1e3:.0f} ms vs "
        f"{r['duckdb_s'] * 1e3:.0f} ms)" for r in costs))


if __name__ == "__main__":
    main()
