"""Analysts' latency while a release runs: DP queries over the wire, without and during a fit.

    PYTHONPATH=. python benchmarks/release_latency.py [--analysts 20] [--seconds 10]
        [--runs 3] [--sample] [--json]

The wire server runs in this process on a fresh store of the Adult data. ``--analysts``
threads, each with its own psycopg connection, ask distinct DP queries (so the answer
cache never serves one): first for ``--seconds`` with nothing else running, then while
an administrator's session in the same process releases a NAPSU-MQ table (Laplace
inference, 8 restarts: 7-15 s on full Adult and two shared cores), which
runs as a job whose fit is in a worker process. A first phase of ``--seconds`` warms
the server up and is not measured. Prints p50 and p99 per phase (median over
``--runs``), the release's wall time, peak memory of this process and of the worker,
and the ratio of the p99s (target: at most 2).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from _common import peak_rss_mb, print_table, readme, shared_data

import dpsql
from dpsql import passwords
from dpsql.server.server import Server, ServerConfig

SAMPLE = Path(str(dpsql.__path__[0])) / "data" / "adult_sample.csv"
PASSWORD = "benchmark-pass-1"
POLICY = """version: 1
accounting: zcdp
delta: 1.0e-6
datasets:
  adult:
    table: adult
    budget: {epsilon: 1000000}
    query_cap: {epsilon: 1}
    default_query: {epsilon: 0.01}
    synthesizers: [napsu_mq]
    columns:
      age: {type: integer, bounds: [0, 84], bins: 5}
      sex: {type: categorical, values: [0, 1]}
      race: {type: categorical, values: [0, 1, 2, 3, 4]}
      education_num: {type: integer, bounds: [0, 15], bins: 4}
      income_50k: {type: categorical, values: [0, 1]}
users:
  admin: {role: admin, budgets: {adult: {epsilon: 1000}}}
  bench: {role: analyst, budgets: {adult: {epsilon: 1000000}}, max_connections: 64}
"""
RELEASE = {"synthesizer": "napsu_mq", "epsilon": 1,
           "columns": ["age", "sex", "race", "education_num", "income_50k"],
           "inference": "laplace", "restarts": 8}
SHAPES = ["SELECT sex, COUNT(*) FROM adult WHERE age BETWEEN {a} AND {b} AND "
          "education_num >= {e} GROUP BY sex",
          "SELECT race, COUNT(*) FROM adult WHERE age BETWEEN {a} AND {b} AND "
          "education_num <= {e} GROUP BY race",
          "SELECT COUNT(*) FROM adult WHERE age BETWEEN {a} AND {b} AND education_num = {e}"]
_distinct = itertools.product(range(85), range(85), range(16), range(len(SHAPES)))


def next_query() -> str:
    """A DP query never asked before in this run (so never answered from the cache)."""
    a, b, e, shape = next(_distinct)
    return SHAPES[shape].format(a=min(a, b), b=max(a, b) + 1, e=e)


def make_store(directory: Path, sample: bool) -> Path:
    policy = directory / "bench.yaml"
    policy.write_text(POLICY)
    data = SAMPLE if sample else shared_data("adult", "adult.csv")
    path = directory / "bench.duckdb"
    store, _ = dpsql.init(path, policy, {"adult": data})
    passwords.set_password(store, "bench", PASSWORD)
    store.close()
    return path


class InProcessServer:
    """The wire server on its own event loop thread, sharing this process's Store."""

    def __init__(self, db: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = Server(ServerConfig(db=db, port=0, allow_plaintext=True, workers=8))
        self.loop.run_until_complete(self.server.start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.dsn = (f"host=127.0.0.1 port={self.server.port} dbname=adult user=bench "
                    f"password={PASSWORD}")

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def analysts(dsn: str, count: int, until: threading.Event) -> list[float]:
    """Latencies of ``count`` analysts asking DP queries until ``until`` is set."""
    lock = threading.Lock()  # next_query's iterator is shared by the analysts
    out: list[float] = []
    errors: list[BaseException] = []
    ready = threading.Barrier(count + 1)

    def work() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                ready.wait()
                while not until.is_set():
                    with lock:
                        text = next_query()
                    start = time.perf_counter()
                    conn.execute(text).fetchall()
                    elapsed = time.perf_counter() - start
                    with lock:
                        out.append(elapsed)
        except BaseException as err:
            errors.append(err)
            ready.abort()

    threads = [threading.Thread(target=work) for _ in range(count)]
    for thread in threads:
        thread.start()
    ready.wait()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def one_run(db: Path, server: InProcessServer, analyst_count: int, seconds: float,
            number: int) -> dict[str, float]:
    """Baseline for ``seconds``, then the same load for as long as one release runs."""
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    quiet = analysts(server.dsn, analyst_count, stop)
    print(f"run {number}: {len(quiet)} queries without a release", file=sys.stderr, flush=True)

    during_stop = threading.Event()
    result: dict[str, float] = {}

    def release() -> None:
        with dpsql.connect(db, "admin") as admin:
            start = time.perf_counter()
            try:
                admin.release("adult", name=f"syn_{number}", **RELEASE)
            finally:
                result["release_s"] = time.perf_counter() - start
                during_stop.set()

    releaser = threading.Thread(target=release)
    releaser.start()
    busy = analysts(server.dsn, analyst_count, during_stop)
    releaser.join()
    print(f"run {number}: {len(busy)} queries during a {result['release_s']:.0f} s release",
          file=sys.stderr, flush=True)
    return {"p50_quiet_ms": 1000 * percentile(quiet, 0.5),
            "p99_quiet_ms": 1000 * percentile(quiet, 0.99),
            "p50_release_ms": 1000 * percentile(busy, 0.5),
            "p99_release_ms": 1000 * percentile(busy, 0.99),
            "queries_quiet": len(quiet), "queries_release": len(busy), **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--analysts", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="Length of the baseline phase of each run.")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sample", action="store_true",
                        help="Use the bundled 5,000-row sample instead of the full Adult data.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = make_store(Path(tmp), args.sample)
        with dpsql.connect(db, "admin"):  # holds the store open across the runs
            server = InProcessServer(db)
            try:
                warm = threading.Event()
                threading.Timer(args.seconds, warm.set).start()
                analysts(server.dsn, args.analysts, warm)
                runs = [one_run(db, server, args.analysts, args.seconds, i)
                        for i in range(args.runs)]
            finally:
                server.stop()
    summary = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    ratio = summary["p99_release_ms"] / summary["p99_quiet_ms"]
    worker_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    rows = [{"phase": phase, "p50 ms": f"{summary[f'p50_{key}_ms']:.1f}",
             "p99 ms": f"{summary[f'p99_{key}_ms']:.1f}",
             "queries": int(summary[f"queries_{key}"])}
            for phase, key in (("no release", "quiet"), ("during a release", "release"))]
    print_table(rows, args.json)
    if not args.json:
        print(f"release wall time {summary['release_s']:.1f} s (median of {args.runs}); "
              f"p99 during / without = {ratio:.2f} (target <= 2); peak memory: this process "
              f"{peak_rss_mb():.0f} MB, the worker {worker_mb:.0f} MB")
    readme(f"{args.analysts} analysts, p99 {summary['p99_quiet_ms']:.0f} ms without a "
           f"release, {summary['p99_release_ms']:.0f} ms during a "
           f"{summary['release_s']:.0f} s release ({ratio:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
