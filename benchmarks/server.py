"""What the wire costs: DP queries through `dpsql serve` + psycopg vs the Python API.

    python benchmarks/server.py [--queries 1000] [--clients 8] [--rounds 3] [--json]

Latency: ``--queries`` distinct DP queries (distinct, so the answer cache never
serves one) on one connection, p50 and p99, next to the same queries through
``session.sql`` in this process. Throughput: ``--clients`` concurrent clients
(threads with their own psycopg connection / their own Session), median
queries per second over ``--rounds`` rounds of fresh queries. Each path runs on
its own copy of the same freshly made store. The ratios are wire / API.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import psycopg
from _common import peak_rss_mb, print_table, readme

import dpsql
from dpsql import passwords

SHARED = next((p / "shared" / "data" / "adult" / "adult.csv"
               for p in Path(__file__).resolve().parents
               if (p / "shared" / "data" / "adult" / "adult.csv").exists()), Path("/nonexistent"))
SAMPLE = Path(str(dpsql.__path__[0])) / "data" / "adult_sample.csv"
PASSWORD = "benchmark-pass-1"
POLICY = """version: 1
accounting: pure
datasets:
  adult:
    table: adult
    budget: {epsilon: 1000000}
    query_cap: {epsilon: 1}
    default_query: {epsilon: 0.01}
    columns:
      age: {type: integer, bounds: [0, 84], bins: 10}
      sex: {type: categorical, values: [0, 1]}
      race: {type: categorical, values: [0, 1, 2, 3, 4]}
      education_num: {type: integer, bounds: [0, 15], bins: 1}
      income_50k: {type: categorical, values: [0, 1]}
users:
  admin: {role: admin, budgets: {adult: {epsilon: 1}}}
  bench: {role: analyst, budgets: {adult: {epsilon: 1000000}}, max_connections: 64}
"""
SHAPES = ["SELECT sex, COUNT(*) FROM adult WHERE age >= {a} AND education_num >= {e} "
          "GROUP BY sex",
          "SELECT race, COUNT(*) FROM adult WHERE age <= {a} AND education_num <= {e} "
          "GROUP BY race",
          "SELECT income_50k, COUNT(*) FROM adult WHERE age >= {a} AND education_num <= {e} "
          "GROUP BY income_50k",
          "SELECT COUNT(*) FROM adult WHERE age <= {a} AND education_num >= {e}"]


def queries(shape: int, count: int) -> list[str]:
    """``count`` distinct queries of one shape (85 x 16 filter pairs per shape)."""
    pairs = itertools.product(range(85), range(16))
    return [SHAPES[shape % len(SHAPES)].format(a=a, e=e)
            for a, e in itertools.islice(pairs, count)]


def make_store(directory: Path, sample: bool) -> Path:
    policy = directory / "bench.yaml"
    policy.write_text(POLICY)
    data = SAMPLE if sample or not SHARED.exists() else SHARED
    path = directory / "bench.duckdb"
    store, _ = dpsql.init(path, policy, {"adult": data})
    passwords.set_password(store, "bench", PASSWORD)
    store.close()
    return path


class Served:
    """`dpsql serve` on a copy of the store."""

    def __init__(self, db: Path) -> None:
        self.process = subprocess.Popen(
            ["nice", "-n", "5", sys.executable, "-m", "dpsql", "serve", "--db", str(db),
             "--port", "0", "--log-level", "warning"], stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert self.process.stderr is not None
        for line in self.process.stderr:
            match = re.search(r"listening on [\d.]+:(\d+)", line)
            if match:
                self.port = int(match.group(1))
                break
        threading.Thread(target=self.process.stderr.read, daemon=True).start()
        self.dsn = f"host=127.0.0.1 port={self.port} dbname=adult user=bench password={PASSWORD}"

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)


def latencies(run: Callable[[str], object], texts: list[str]) -> list[float]:
    out = []
    for text in texts:
        start = time.perf_counter()
        run(text)
        out.append(time.perf_counter() - start)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


Runner = Callable[[str], object]


def throughput(clients: int, texts: list[str],
               opener: Callable[[], AbstractContextManager[Runner]]) -> float:
    """Queries per second with ``clients`` threads sharing out ``texts``."""
    slices = [texts[i::clients] for i in range(clients)]
    barrier = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def work(mine: list[str]) -> None:
        try:
            with opener() as run:
                barrier.wait()
                for text in mine:
                    run(text)
        except BaseException as err:
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(s,)) for s in slices]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return len(texts) / (time.perf_counter() - start)


class _Api(AbstractContextManager[Runner]):
    def __init__(self, db: Path) -> None:
        self.session = dpsql.connect(db, "bench")

    def __enter__(self) -> Runner:
        return self.session.sql

    def __exit__(self, *exc: object) -> None:
        self.session.close()


class _Wire(AbstractContextManager[Runner]):
    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)

    def __enter__(self) -> Runner:
        return lambda text: self.conn.execute(text).fetchall()

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sample", action="store_true",
                        help="Use the bundled 5,000-row sample instead of the full Adult data.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = make_store(Path(tmp), args.sample)
        api_db, wire_db = Path(tmp) / "api.duckdb", Path(tmp) / "wire.duckdb"
        shutil.copy(base, api_db)
        shutil.copy(base, wire_db)
        warm = queries(0, args.queries + 20)[-20:]  # never asked again: no cache hits

        served = Served(wire_db)
        try:
            with _Api(api_db) as api, _Wire(served.dsn) as wire:
                for text in warm:
                    api(text)
                    wire(text)
                api_lat, wire_lat = [], []
                for text in queries(0, args.queries):  # interleaved: both see the same load
                    api_lat += latencies(api, [text])
                    wire_lat += latencies(wire, [text])
            per_round = max(args.clients, args.queries // 2)
            wire_qps, api_qps = [], []
            for r in range(args.rounds):
                texts = queries(1 + r, per_round)
                wire_qps.append(throughput(args.clients, texts, lambda: _Wire(served.dsn)))
                api_qps.append(throughput(args.clients, texts, lambda: _Api(api_db)))
            server_rss = served.peak_rss_mb()
        finally:
            served.stop()

    qps = f"qps_{args.clients}_clients"
    rows = [
        {"path": "python API", "p50_ms": 1000 * statistics.median(api_lat),
         "p99_ms": 1000 * percentile(api_lat, 0.99),
         qps: statistics.median(api_qps),
         "peak_rss_mb": peak_rss_mb()},
        {"path": "wire (psycopg)", "p50_ms": 1000 * statistics.median(wire_lat),
         "p99_ms": 1000 * percentile(wire_lat, 0.99),
         qps: statistics.median(wire_qps),
         "peak_rss_mb": server_rss},
    ]
    rows.append({"path": "ratio wire/API", "p50_ms": rows[1]["p50_ms"] / rows[0]["p50_ms"],
                 "p99_ms": rows[1]["p99_ms"] / rows[0]["p99_ms"],
                 qps: rows[1][qps] / rows[0][qps],
                 "peak_rss_mb": float("nan")})
    data = "bundled sample (5,000 rows)" if args.sample or not SHARED.exists() \
        else "adult (48,842 rows)"
    print(f"{args.queries} distinct DP queries, one connection; throughput: {args.clients} "
          f"clients, median of {args.rounds} rounds of {per_round} queries; data: {data}")
    print_table(rows, as_json=args.json)
    if not args.json:
        readme(f"{data}: p50 {rows[1]['p50_ms']:.1f} vs {rows[0]['p50_ms']:.1f} ms; "
               f"{args.clients} clients {rows[1][qps]:.0f} vs {rows[0][qps]:.0f} queries/s")


if __name__ == "__main__":
    main()
