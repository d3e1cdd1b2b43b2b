"""The answer cache under load: its size across many distinct DP queries stays under its limit.

Every distinct DP query (here: a new epsilon each time, so a new measurement)
stores its noisy answer so that a repeat is free. The policy's
``answer_cache_mb`` bounds what they take; beyond it the oldest are dropped. This
sends ``--queries`` distinct COUNT-by-two-keys queries on the bundled Adult
sample, and prints the largest size the cache reached (checked after every
settle), how many answers it holds at the end, the time per query and the peak
memory of the process.

    python benchmarks/answer_cache.py [--queries 10000] [--limit-mb 1] [--json]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from importlib import resources
from pathlib import Path

import yaml
from _common import peak_rss_mb, print_table, readme

import dpsql
from dpsql.ledger.books import settled

SQL = "SELECT race, sex, COUNT(*) FROM adult GROUP BY race, sex"


def build(directory: Path, limit_mb: float) -> Path:
    data = Path(str(resources.files("dpsql").joinpath("data")))
    raw = yaml.safe_load((data / "adult.yaml").read_text())
    big = {"epsilon": 1_000_000}
    raw["answer_cache_mb"] = limit_mb
    raw["datasets"]["adult"].update(budget=big, query_cap={"epsilon": 10})
    for user in raw["users"].values():
        user["budgets"] = {"adult": big}
    policy = directory / "policy.yaml"
    policy.write_text(yaml.safe_dump(raw))
    path = directory / "cache.duckdb"
    store, _ = dpsql.init(path, policy, {"adult": data / "adult_sample.csv"})
    store.close()
    return path


def cache_size(session: dpsql.Session) -> tuple[int, int]:
    """(answers stored, bytes they count against the limit), once every settle committed."""
    settled(session.store)
    row = session.store.cursor().execute(
        "SELECT count(*), coalesce(sum(strlen(plan) + strlen(noise) + octet_length(measures)), "
        "0) FROM dpsql.query_cache").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--limit-mb", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    limit = int(args.limit_mb * 1e6)
    with tempfile.TemporaryDirectory(prefix="dpsql-bench-") as tmp:
        path = build(Path(tmp), args.limit_mb)
        largest, over = 0, 0
        with dpsql.connect(path, "alice") as session:
            start = time.perf_counter()
            for i in range(args.queries):
                session.sql(f"SET dpsql.epsilon = {1 + i / 1e6}")
                assert not session.sql(SQL).cached
                if i % 50 == 49 or i == args.queries - 1:  # the size checks cost a drain
                    size = cache_size(session)[1]
                    largest = max(largest, size)
                    over += size > limit
            per_query = (time.perf_counter() - start) / args.queries
            answers, final = cache_size(session)
            session.sql("SET dpsql.epsilon = 1")
            first_again = session.sql(SQL)
        load = os.getloadavg()[0]
    rows = [{"queries": args.queries, "limit_bytes": limit, "largest_bytes": largest,
             "final_bytes": final, "answers_kept": answers, "checks_over_limit": over,
             "first_repeat_cached": first_again.cached, "ms_per_query": per_query * 1e3,
             "peak_rss_mb": peak_rss_mb(), "load": load}]
    print_table(rows, args.json)
    if not args.json:
        readme(f"{args.queries:,} distinct queries under a {args.limit_mb:g} MB limit: largest "
               f"{largest / 1e6:.3f} MB, {answers} answers kept at the end, {over} checks over "
               f"the limit; {per_query * 1e3:.1f} ms a query (load {load:.1f})")


if __name__ == "__main__":
    main()
