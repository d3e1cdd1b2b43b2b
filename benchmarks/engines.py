"""DP queries on another engine: plain engine vs dpsql on it, and the store's DuckDB beside.

A throwaway PostgreSQL cluster (``tests/pgcluster.py``: ``initdb`` on a free
port, ``fsync=off``) gets ``--rows`` rows (the Adult sample replicated,
written by DuckDB as CSV and loaded with ``COPY``). For each query, interleaved,
median of ``--runs``: the plain query on one open psycopg connection, the same
DP query through ``Session.sql`` on a dataset whose engine is that table (a new
epsilon each run, so the answer cache never serves it), and the plain query and
the DP query on a DuckDB store holding the same rows. Prints each ratio, the
time per query across engines, and the peak RSS of this process (the driver:
the engine's rows never come here, only aggregates).

    python benchmarks/engines.py [--rows 10000000] [--runs 8] [--json]
"""

from __future__ import annotations

import argparse
import os
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ[PASSWORD_ENV] = pgcluster.READER_PASSWORD
    with tempfile.TemporaryDirectory(prefix="dpsql-engines-") as tmp, \
            pgcluster.cluster() as cluster:
        directory = Path(tmp)
        csv = rows_csv(directory, args.rows)
        load_postgres(cluster, csv)
        duck_policy, pg_policy = policies(directory, cluster)
        duck_path, pg_path = directory / "duck.duckdb", directory / "pg.duckdb"
        dpsql.init(duck_path, duck_policy, {"adult": csv})[0].close()
        dpsql.init(pg_path, pg_policy)[0].close()
        csv.unlink()
        results = []
        counter = iter(range(10**6))
        with dpsql.connect(pg_path, "alice") as on_pg, \
                dpsql.connect(duck_path, "alice") as on_duck, \
                psycopg.connect(cluster.dsn(password=pgcluster.READER_PASSWORD)) as plain_pg:
            plain_duck = on_duck.store.cursor()
            for name, sql in QUERIES.items():
                times: dict[str, list[float]] = {"pg": [], "dp_pg": [], "duck": [], "dp_duck": []}

                def dp(session: dpsql.Session, sql: str = sql) -> None:
                    session.sql(f"SET dpsql.epsilon = {1 + next(counter) / 10**6}")
                    assert not session.sql(sql).cached

                for run in range(args.runs + 1):  # the first run warms every path
                    spent = {"pg": timed(lambda s=sql: plain_pg.execute(s).fetchall()),
                             "dp_pg": timed(lambda: dp(on_pg)),
                             "duck": timed(lambda s=sql: plain_duck.execute(s).fetchall()),
                             "dp_duck": timed(lambda: dp(on_duck))}
                    if run:
                        for key, value in spent.items():
                            times[key].append(value)
                m = {key: median(value) for key, value in times.items()}
                results.append({"query": name, "rows": args.rows, "postgres_s": m["pg"],
                                "dpsql_on_postgres_s": m["dp_pg"],
                                "ratio_postgres": m["dp_pg"] / m["pg"],
                                "duckdb_s": m["duck"], "dpsql_on_duckdb_s": m["dp_duck"],
                                "ratio_duckdb": m["dp_duck"] / m["duck"],
                                "load": os.getloadavg()[0]})
        print_table(results, args.json)
        if not args.json:
            rss = peak_rss_mb()
            print(f"median of {args.runs} runs each; peak RSS of the driver {rss:.0f} MB")
            figures = "; ".join(f"{r['query']}: PostgreSQL {r['ratio_postgres']:.2f}x "
                                f"({r['dpsql_on_postgres_s'] * 1e3:.0f} vs "
                                f"{r['postgres_s'] * 1e3:.0f} ms), DuckDB "
                                f"{r['ratio_duckdb']:.2f}x" for r in results)
            readme(f"engines, {args.rows:,} rows, median of {args.runs}: {figures}; "
                   f"driver peak RSS {rss:.0f} MB; load {results[-1]['load']:.1f}")


if __name__ == "__main__":
    main()
