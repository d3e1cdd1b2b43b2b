"""Cost that should stay flat as data grows: ``dpsql init``'s peak memory and ``sds`` time.

Init: the full Adult file replicated to each of ``--rows`` rows (10 and 50 million
by default) as Parquet under a temporary directory, imported by ``dpsql init``
(the CLI, with the Adult policy of the SDS benchmarks) and by plain DuckDB
(``CREATE TABLE AS SELECT * FROM read_parquet`` with DuckDB's default settings,
in a ``python -c`` process), interleaved, each in a fresh process; the peak
resident memory of that process (``getrusage`` of the children, read by a small
wrapper process per run), median of ``--runs``. Both figures include a Python
interpreter and its imports: printed beside them, the peak of a process that only
imports what each needs (dpsql's CLI and session; duckdb), and plain DuckDB's
import under dpsql's import limits (:data:`dpsql.store.IMPORT_LIMITS`, 64 MB, one thread):
DuckDB caches every block it writes up to its limit (80% of RAM by default), so
plain DuckDB's default figure grows with rows and dpsql's does not.

SDS: fit and sample (as many records as the source) on Adult replicated to
``--sds-rows`` rows (1 million by default) and on Adult itself (48,842 rows),
epsilon 1, delta 1e-6, in this process, median of ``--sds-runs``.

Each figure is printed with the host's load average (1 minute) beside it.

    python benchmarks/scale.py [--rows 10000000,50000000] [--sds-rows 1000000]
                               [--runs 3] [--sds-runs 3] [--skip-init | --skip-sds]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
from _common import adult10_policy, readme, shared_data

import dpsql
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.imports import IMPORT_LIMITS
from dpsql.policies import active_policy
from dpsql.privacy import rho_from_epsilon_delta
from dpsql.synth import get

ADULT_ROWS = 48_842
LIMITS = [f"{key}={value}" for key, value in IMPORT_LIMITS.items()]
# Runs a command and prints the peak resident memory (kB) of its process tree's largest.
PEAK = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
        "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
PLAIN = """import duckdb, sys
con = duckdb.connect(sys.argv[1], config=dict(a.split("=") for a in sys.argv[3:]))
con.execute("SET enable_progress_bar = false")
con.execute(f"CREATE TABLE adult AS SELECT * FROM read_parquet('{sys.argv[2]}')")
"""


def load() -> str:
    """The host's 1-minute load average, to print beside a figure."""
    return f"load {os.getloadavg()[0]:.2f}"


def replicate(rows: int, path: Path) -> Path:
    """Write the Adult file replicated (and cut) to ``rows`` rows as Parquet at ``path``."""
    source = shared_data("adult", "adult.csv")
    copies = -(-rows // ADULT_ROWS)
    con = duckdb.connect()
    try:
        con.execute(f"COPY (SELECT a.* FROM read_csv('{source}') a, range({copies}) LIMIT {rows}) "
                    f"TO '{path}' (FORMAT parquet)")
    finally:
        con.close()
    return path


def peak_mb(command: list[str]) -> float:
    """Peak resident memory of ``command`` run in a fresh process, in MB."""
    out = subprocess.run([sys.executable, "-c", PEAK, *command], check=True,
                         capture_output=True, text=True).stdout
    return int(out.split()[-1]) / 1024


def init_peaks(rows: int, runs: int, workdir: Path) -> dict[str, float]:
    """Median peak memory (MB) of ``dpsql init`` and of plain DuckDB importing ``rows`` rows,
    of plain DuckDB under dpsql's import memory limit, and of each one's imports alone."""
    data = replicate(rows, workdir / f"adult_{rows}.parquet")
    policy = workdir / "adult.yaml"
    policy.write_text(adult10_policy("{epsilon: 10}"))
    cli = Path(sys.executable).with_name("dpsql")
    peaks: dict[str, list[float]] = {"dpsql": [], "duckdb": [], "duckdb capped": [],
                                     "dpsql imports": [], "duckdb imports": []}
    for run in range(runs):
        store, plain = workdir / f"store_{run}.duckdb", workdir / f"plain_{run}.duckdb"
        peaks["dpsql"].append(peak_mb([str(cli), "init", str(store), "--policy", str(policy),
                                        "--import", f"adult={data}"]))
        peaks["duckdb"].append(peak_mb([sys.executable, "-c", PLAIN, str(plain), str(data)]))
        plain.unlink()
        peaks["duckdb capped"].append(peak_mb([sys.executable, "-c", PLAIN, str(plain),
                                               str(data), *LIMITS]))
        peaks["dpsql imports"].append(peak_mb([sys.executable, "-c",
                                               "import dpsql.cli, dpsql.session"]))
        peaks["duckdb imports"].append(peak_mb([sys.executable, "-c", "import duckdb"]))
        for leftover in (store, plain):
            leftover.unlink()
    data.unlink()
    return {name: statistics.median(values) for name, values in peaks.items()}


def sds_seconds(rows: int, runs: int, workdir: Path) -> float:
    """Median seconds of an SDS fit and sample of ``rows`` records on Adult of ``rows`` rows."""
    source = shared_data("adult", "adult.csv")
    if rows != ADULT_ROWS:
        source = replicate(rows, workdir / f"sds_{rows}.parquet")
    policy = workdir / "adult.yaml"
    policy.write_text(adult10_policy("{epsilon: 100}"))
    store, _ = dpsql.init(workdir / f"sds_{rows}.duckdb", policy, {"adult": source})
    try:
        dataset = active_policy(store).dataset("adult")
        domain = Domain.from_dataset(dataset)
        sds = get("sds")  # loads the synthesizer registry (and PyTorch) outside the timing
        times = []
        for seed in range(runs):
            rng = np.random.default_rng(seed)
            start = time.perf_counter()
            fitted = sds.fit(bounded_relation(store, dataset), domain,
                             rho_from_epsilon_delta(1.0, 1e-6), rng)
            fitted_at = time.perf_counter()
            fitted.sample(fitted.rows, rng)
            times.append(time.perf_counter() - start)
            print(f"  sds {rows:>12,} rows, run {seed}: fit {fitted_at - start:5.1f} s, sample "
                  f"{times[-1] - (fitted_at - start):5.1f} s  ({load()})", flush=True)
    finally:
        store.close()
    return statistics.median(times)


def sds_figures(rows: int, runs: int, workdir: Path) -> str:
    """Print the sds times at ``rows`` and on Adult itself; their README: words."""
    big = sds_seconds(rows, runs, workdir)
    print(f"sds {rows:>12,} rows: {big:6.1f} s  ({load()})", flush=True)
    small = sds_seconds(ADULT_ROWS, runs, workdir)
    print(f"sds {ADULT_ROWS:>12,} rows: {small:6.1f} s  ({load()}); ratio {big / small:.1f}x "
          f"for {rows / ADULT_ROWS:.1f}x rows", flush=True)
    return f"sds {big:.1f} s at {rows:,} rows ({small:.1f} s at {ADULT_ROWS:,})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="10000000,50000000",
                        help="comma-separated row counts for init (default: 10M, 50M)")
    parser.add_argument("--sds-rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3, help="runs of each init")
    parser.add_argument("--sds-runs", type=int, default=3, help="runs of each sds release")
    parser.add_argument("--skip-init", action="store_true", help="measure sds only")
    parser.add_argument("--skip-sds", action="store_true", help="measure init only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        peaks = {}
        for rows in () if args.skip_init else (int(r) for r in args.rows.split(",")):
            peaks[rows] = init_peaks(rows, args.runs, workdir)
            ours, plain = peaks[rows]["dpsql"], peaks[rows]["duckdb"]
            print(f"init {rows:>11,} rows: dpsql {ours:7.0f} MB, plain DuckDB {plain:7.0f} MB, "
                  f"ratio {ours / plain:.2f}x  ({load()})\n"
                  f"    imports alone: dpsql {peaks[rows]['dpsql imports']:.0f} MB, duckdb "
                  f"{peaks[rows]['duckdb imports']:.0f} MB; plain DuckDB with "
                  f"{', '.join(LIMITS)}: {peaks[rows]['duckdb capped']:.0f} MB", flush=True)
        sds = "" if args.skip_sds else sds_figures(args.sds_rows, args.sds_runs, workdir)
    sizes = sorted(peaks)

    def each(values: list[float], spec: str) -> str:
        return " / ".join(format(v, spec) for v in values)

    init = (f"init peak memory {each([peaks[r]['dpsql'] for r in sizes], '.0f')} MB vs plain "
            f"DuckDB {each([peaks[r]['duckdb'] for r in sizes], '.0f')} MB at "
            f"{each(sizes, ',')} rows" if sizes else "")
    readme("; ".join(part for part in (init, sds) if part))

if __name__ == "__main__":
    main()
