"""Throughput of dpsql's exact samplers against OpenDP's on a million counts.

Noises ``--n`` integer counts with the discrete Laplace (scales 1, 10, 1000)
and the discrete Gaussian (sigma 1, 10, 1000): median wall time of ``--runs``
runs, peak Python-heap memory of one extra run (tracemalloc, which sees numpy
buffers but not OpenDP's Rust heap), throughput, and OpenDP's time for the same
job in the same process (``--opendp-runs``, default 1: it is slow). Then the
latency of one draw (a global aggregate's noise): median of ``--calls`` calls
of size 1 through the Python-int path, against the vectorized numpy path
forced for the same calls. Prints tables, or JSON with ``--json``. Never
asserts on time.

    python benchmarks/noise_throughput.py [--n 1000000] [--runs 5] [--no-opendp] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import readme, span

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpsql import _exact, noise

CASES = [
    ("discrete_laplace", 1.0),
    ("discrete_laplace", 10.0),
    ("discrete_laplace", 1000.0),
    ("discrete_gaussian", 1.0),
    ("discrete_gaussian", 10.0),
    ("discrete_gaussian", 1000.0),
]


def ours(mechanism: str, scale: float) -> Callable[[np.ndarray], np.ndarray]:
    if mechanism == "discrete_laplace":
        return lambda counts: noise.add_discrete_laplace(counts, scale)
    return lambda counts: noise.add_discrete_gaussian(counts, scale**2)


def opendp_sampler(mechanism: str, scale: float) -> Callable[[list[int]], Any] | None:
    try:
        import opendp.prelude as dp
    except ImportError:
        return None
    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T=int))
    if mechanism == "discrete_laplace":
        return dp.m.make_laplace(domain, dp.l1_distance(T=int), scale=scale)
    return dp.m.make_gaussian(domain, dp.l2_distance(T=int), scale=scale)


def timed(fn: Callable[[Any], Any], arg: Any, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - start)
    return times


def peak_mib(fn: Callable[[Any], Any], arg: Any) -> float:
    tracemalloc.start()
    try:
        fn(arg)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2**20


def run(n: int, runs: int, opendp_runs: int) -> list[dict[str, Any]]:
    counts = np.zeros(n, dtype=np.int64)
    counts_list = [0] * n
    rows = []
    for mechanism, scale in CASES:
        fn = ours(mechanism, scale)
        fn(counts[:1000])  # warm up imports and caches
        times = timed(fn, counts, runs)
        median = statistics.median(times)
        row: dict[str, Any] = {
            "mechanism": mechanism,
            "scale": scale,
            "n": n,
            "runs": runs,
            "seconds_median": median,
            "seconds_min": min(times),
            "counts_per_second": n / median,
            "peak_mib": peak_mib(fn, counts),
            "opendp_seconds": None,
            "opendp_peak_mib": None,
            "speedup": None,
        }
        theirs = opendp_sampler(mechanism, scale) if opendp_runs > 0 else None
        if theirs is not None:
            their_median = statistics.median(timed(theirs, counts_list, opendp_runs))
            row["opendp_seconds"] = their_median
            row["opendp_peak_mib"] = peak_mib(theirs, counts_list)
            row["speedup"] = their_median / median
        rows.append(row)
    return rows


def one_draw(calls: int) -> list[dict[str, Any]]:
    """Median microseconds of a one-value draw: the Python-int path against numpy's."""
    rows = []
    for mechanism, scale in CASES:
        if mechanism == "discrete_laplace":
            draw = functools.partial(noise.discrete_laplace, scale)
        else:
            draw = functools.partial(noise.discrete_gaussian, scale**2)
        medians = {}
        for path, limit in (("ints", _exact.SCALAR_DRAWS), ("numpy", 0)):
            saved, _exact.SCALAR_DRAWS = _exact.SCALAR_DRAWS, limit
            try:
                draw(1)
                medians[path] = statistics.median(timed(draw, 1, calls)) * 1e6
            finally:
                _exact.SCALAR_DRAWS = saved
        rows.append({"mechanism": mechanism, "scale": scale, "calls": calls,
                     "ints_us": medians["ints"], "numpy_us": medians["numpy"],
                     "speedup": medians["numpy"] / medians["ints"]})
    return rows


def one_draw_table(rows: list[dict[str, Any]]) -> str:
    head = f"{'mechanism':<18} {'scale':>7} {'ints us':>8} {'numpy us':>9} {'speedup':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['mechanism']:<18} {r['scale']:>7g} {r['ints_us']:>8.1f}"
                     f" {r['numpy_us']:>9.1f} {r['speedup']:>7.1f}x")
    lines.append(f"one value per call; median of {rows[0]['calls']} calls each, same process.")
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'mechanism':<18} {'scale':>7} {'dpsql s':>8} {'counts/s':>10} {'peak MiB':>9}"
        f" {'OpenDP s':>9} {'OpenDP MiB':>10} {'speedup':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        their = "-" if r["opendp_seconds"] is None else f"{r['opendp_seconds']:.2f}"
        their_mem = "-" if r["opendp_peak_mib"] is None else f"{r['opendp_peak_mib']:.1f}"
        speed = "-" if r["speedup"] is None else f"{r['speedup']:.1f}x"
        lines.append(
            f"{r['mechanism']:<18} {r['scale']:>7g} {r['seconds_median']:>8.3f}"
            f" {r['counts_per_second']:>10.3g} {r['peak_mib']:>9.1f}"
            f" {their:>9} {their_mem:>10} {speed:>8}"
        )
    lines.append(
        f"n = {rows[0]['n']:,} counts; dpsql: median of {rows[0]['runs']} runs; scale is the"
        " Laplace scale or the Gaussian sigma; peak = Python heap (tracemalloc; OpenDP's Rust"
        " heap is not seen)."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="counts per run")
    parser.add_argument("--runs", type=int, default=5, help="timed runs of dpsql per case")
    parser.add_argument("--opendp-runs", type=int, default=1, help="timed runs of OpenDP per case")
    parser.add_argument("--no-opendp", action="store_true", help="skip the OpenDP comparison")
    parser.add_argument("--calls", type=int, default=2000, help="one-value draws per path")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    rows = run(args.n, args.runs, 0 if args.no_opendp else args.opendp_runs)
    single = one_draw(args.calls)
    if args.json:
        meta = {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "machine": platform.machine(),
        }
        print(json.dumps({"meta": meta, "results": rows, "one_draw": single}, indent=2))
    else:
        print(table(rows))
        print()
        print(one_draw_table(single))
        readme_line(rows, single)


def readme_line(rows: list[dict[str, Any]], single: list[dict[str, Any]]) -> None:
    """The README's two rows: a million counts, then one value per call."""
    def of(table: list[dict[str, Any]], mechanism: str, key: str) -> list[float]:
        return [r[key] for r in table if r["mechanism"] == mechanism]

    speedups = [r["speedup"] for r in rows if r["speedup"] is not None]
    opendp = f"; {span(speedups, '.0f')}x OpenDP" if speedups else "; OpenDP not run"
    readme(f"{rows[0]['n']:,} counts, median of {rows[0]['runs']} runs: discrete Laplace "
           f"{span(of(rows, 'discrete_laplace', 'seconds_median'), '.2f')} s, discrete Gaussian "
           f"{span(of(rows, 'discrete_gaussian', 'seconds_median'), '.2f')} s{opendp}")
    readme(f"one value, median of {single[0]['calls']} calls: discrete Laplace "
           f"{span(of(single, 'discrete_laplace', 'ints_us'), '.0f')} us, discrete Gaussian "
           f"{span(of(single, 'discrete_gaussian', 'ints_us'), '.0f')} us; "
           f"{span([r['speedup'] for r in single], '.0f')}x the vectorized path")


if __name__ == "__main__":
    main()
