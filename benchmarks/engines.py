"""DP queries on another engine: plain engine vs dpsql on it, and the store's DuckDB beside.

A throwaway PostgreSQL cluster (``tests/pgcluster.py``: ``initdb`` on a free
port, ``fsync=off``) gets ``--rows`` rows (the Adult sample replicated,
written by DuckDB as CSV and loaded with ``COPY``). For each query, interleaved,
median of ``--runs``: the plain query on one open psycopg connection, the same
DP query through ``Session.sql`` on a dataset whose engine is that table (a new
epsilon each run, so the answer cache never serves it), and the plain query and
the DP query on a DuckDB store holding the same rows. Prints each ratio, the
time per query across engines, and the peak RSS of this process while it
queried PostgreSQL (the driver: the engine's rows never come here, only
aggregates; the rows and the DuckDB store are made by a child process).

    python benchmarks/engines.py [--rows 10000000] [--runs 8] [--json]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import yaml
from _common import peak_rss_mb, print_table, readme

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dpsql
from tests import pgcluster

QUERIES = {
    "count by 2 categoricals": "SELECT sex, race, COUNT(*) FROM adult GROUP BY sex, race",
    "sum with BETWEEN": "SELECT SUM(capital_gain) FROM adult WHERE age BETWEEN 20 AND 40",
}
SAMPLE_ROWS = 5000
PASSWORD_ENV = "DPSQL_BENCH_PG_PASSWORD"


def rows_csv(directory: Path, rows: int) -> Path:
    """The Adult sample replicated to ``rows`` rows, as a CSV file."""
    sample = Path(str(resources.files("dpsql").joinpath("data"))) / "adult_sample.csv"
    path = directory / "rows.csv"
    copies = -(-rows // SAMPLE_ROWS)
    duckdb.sql(f"COPY (SELECT a.* FROM '{sample}' a, range({copies}) LIMIT {rows}) "
               f"TO '{path}' (HEADER)")
    path.chmod(0o644)
    directory.chmod(0o755)  # the server (user postgres) reads it
    return path


def load_postgres(cluster: pgcluster.Cluster, csv: Path) -> None:
    """``public.adult`` on the cluster, as the CSV's columns (BIGINT), readable by reader."""
    names = duckdb.sql(f"SELECT * FROM '{csv}' LIMIT 0").columns
    with cluster.admin() as con:
        con.execute(f"CREATE TABLE public.adult ({', '.join(f'{n} bigint' for n in names)})")
        con.execute(f"COPY public.adult FROM '{csv}' (FORMAT csv, HEADER true)")
        con.execute("ANALYZE public.adult")
        con.execute("GRANT SELECT ON public.adult TO reader")


def policies(directory: Path, cluster: pgcluster.Cluster) -> tuple[Path, Path]:
    """The Adult policy with a large budget: for the store, and with the PostgreSQL engine."""
    raw = yaml.safe_load((Path(str(resources.files("dpsql").joinpath("data")))
                          / "adult.yaml").read_text())
    big = {"epsilon": 1_000_000}
    raw["datasets"]["adult"].update(budget=big, query_cap={"epsilon": 10},
                                    default_query={"epsilon": 1})
    for user in raw["users"].values():
        user["budgets"] = {"adult": big}
    duck = directory / "duck.yaml"
    duck.write_text(yaml.safe_dump(raw))
    raw["datasets"]["adult"]["engine"] = {"kind": "postgres", "dsn": cluster.dsn(),
                                          "password_env": PASSWORD_ENV,
                                          "table": "public.adult"}
    pg = directory / "pg.yaml"
    pg.write_text(yaml.safe_dump(raw))
    return duck, pg


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def ratios(plain: Any, session: dpsql.Session, runs: int) -> dict[str, tuple[float, float]]:
    """Query -> (median plain seconds, median dpsql seconds), interleaved, after a warm-up."""
    counter = iter(range(10**6))
    out = {}
    for name, sql in QUERIES.items():
        times: tuple[list[float], list[float]] = ([], [])

        def dp(sql: str = sql) -> None:  # a new epsilon: a new measurement, never the cache
            session.sql(f"SET dpsql.epsilon = {1 + next(counter) / 10**6}")
            assert not session.sql(sql).cached

        for run in range(runs + 1):
            spent = (timed(lambda s=sql: plain.execute(s).fetchall()), timed(dp))
            if run:
                times[0].append(spent[0])
                times[1].append(spent[1])
        out[name] = (median(times[0]), median(times[1]))
    return out


def prepare(directory: Path, rows: int, duck_policy: Path) -> None:
    """In a child process, so the driver's peak memory is its own: the rows and the DuckDB store."""
    csv = rows_csv(directory, rows)
    dpsql.init(directory / "duck.duckdb", duck_policy, {"adult": csv})[0].close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare, args.rows, args.prepare / "duck.yaml")
        return
    os.environ[PASSWORD_ENV] = pgcluster.READER_PASSWORD
    with tempfile.TemporaryDirectory(prefix="dpsql-engines-") as tmp, \
            pgcluster.cluster() as cluster:
        directory = Path(tmp)
        _, pg_policy = policies(directory, cluster)  # duck.yaml: read by the child
        subprocess.run([sys.executable, __file__, "--prepare", str(directory), "--rows",
                        str(args.rows)], check=True)
        load_postgres(cluster, directory / "rows.csv")
        (directory / "rows.csv").unlink()
        dpsql.init(directory / "pg.duckdb", pg_policy)[0].close()
        with dpsql.connect(directory / "pg.duckdb", "alice") as on_pg, \
                psycopg.connect(cluster.dsn(password=pgcluster.READER_PASSWORD)) as plain_pg:
            on_postgres = ratios(plain_pg, on_pg, args.runs)
        driver_mb = peak_rss_mb()  # before this process opens the DuckDB store
        with dpsql.connect(directory / "duck.duckdb", "alice") as on_duck:
            on_duckdb = ratios(on_duck.store.cursor(), on_duck, args.runs)
    results = [{"query": name, "rows": args.rows, "postgres_s": on_postgres[name][0],
                "dpsql_on_postgres_s": on_postgres[name][1],
                "ratio_postgres": on_postgres[name][1] / on_postgres[name][0],
                "duckdb_s": on_duckdb[name][0], "dpsql_on_duckdb_s": on_duckdb[name][1],
                "ratio_duckdb": on_duckdb[name][1] / on_duckdb[name][0]} for name in QUERIES]
    print_table(results, args.json)
    if not args.json:
        load = os.getloadavg()[0]
        print(f"median of {args.runs} runs each; peak RSS of the driver while it queried "
              f"PostgreSQL {driver_mb:.0f} MB; load {load:.1f}")
        figures = "; ".join(f"{r['query']}: PostgreSQL {r['ratio_postgres']:.2f}x "
                            f"({r['dpsql_on_postgres_s'] * 1e3:.0f} vs "
                            f"{r['postgres_s'] * 1e3:.0f} ms), DuckDB "
                            f"{r['ratio_duckdb']:.2f}x" for r in results)
        readme(f"engines, {args.rows:,} rows, median of {args.runs}: {figures}; "
               f"driver peak RSS {driver_mb:.0f} MB; load {load:.1f}")


if __name__ == "__main__":
    main()
