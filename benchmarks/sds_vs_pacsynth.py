"""dpsql's SDS against Microsoft's own implementation (pac-synth), side by side.

Same data (Adult: the 10 columns of the NAPSU-MQ paper, age and hours in 5
buckets, capital gain and loss as "positive or not"; ACS national2019: the
policy's 22 columns), same epsilon (1 and 4), same delta (1e-6), reporting
length 3. For each: mean absolute error of the 1-, 2- and 3-tuple counts
against the true counts, the 2-way workload error and log discrepancy, the
share of empty cells (in columns that are never empty in the data), categories
with a released 1-count that the synthetic data lost, fit+sample time and peak
memory; then the ratios dpsql / pac-synth (below 1 is better for dpsql).

pac-synth runs in its own venv (benchmark-only): create it with
    python3 -m venv /work/venvs/pacsynth
    /work/venvs/pacsynth/bin/pip install pac-synth pandas numpy
Run:  PYTHONPATH=. python benchmarks/sds_vs_pacsynth.py [--repeats 3] [--datasets adult,acs]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import combinations
from pathlib import Path

import numpy as np
from _common import adult10_policy, readme, shared_data, span

import dpsql
from dpsql.analysis import fidelity
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.policies import active_policy
from dpsql.privacy import rho_from_epsilon_delta
from dpsql.services import open_store
from dpsql.store import Store
from dpsql.synth import get
from dpsql.synth.sds import _encoded

ROOT = Path(__file__).resolve().parents[1]
DATA = shared_data("acs").parent
PACSYNTH_PYTHON = Path("/work/venvs/pacsynth/bin/python")
RUNNER = Path(__file__).with_name("pacsynth_runner.py")
DELTA = 1e-6
LENGTH = 3

ADULT_POLICY = adult10_policy("{epsilon: 100}")


# --------------------------------------------------------------------------- data


def build_store(name: str, workdir: Path) -> tuple[Store, Domain, np.ndarray]:
    """A store for ``name``, its domain and the true records' codes (-1 for empty)."""
    path = workdir / f"{name}.duckdb"
    if path.exists():
        store = open_store(path)
    elif name == "adult":
        policy = workdir / "adult.yaml"
        policy.write_text(ADULT_POLICY)
        store, _ = dpsql.init(path, policy, {"adult": DATA / "adult" / "adult.csv"})
    else:
        store, _ = dpsql.init(path, ROOT / "policies" / "acs.yaml",
                              {"acs": DATA / "acs" / "national2019.csv"}, na="N")
    dataset = active_policy(store).dataset(name)
    domain = Domain.from_dataset(dataset)
    codes = _encoded(bounded_relation(store, dataset), domain)
    return store, domain, empty_as_minus_one(codes, domain)


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def empty_as_minus_one(codes: np.ndarray, domain: Domain) -> np.ndarray:
    out = np.asarray(codes, dtype=np.int64).copy()
    for j, attribute in enumerate(domain.attributes):
        out[out[:, j] >= attribute.bins, j] = -1
    return out


# --------------------------------------------------------------------------- metrics
# Tuple errors are computed here (fidelity scores 1- and 2-way crosstabs only); the same
# code scores both tools, so the ratios are fair.


def joint_keys(codes: np.ndarray, cols: tuple[int, ...], sizes: np.ndarray) -> np.ndarray:
    key = np.zeros(len(codes), dtype=np.int64)
    for c in cols:
        key = key * (sizes[c] + 1) + (codes[:, c] + 1)
    return key


def tuple_mae(true: np.ndarray, syn: np.ndarray, sizes: np.ndarray, k: int) -> float:
    """Mean |true - synthetic| count over every k-tuple present in either (synthetic counts
    scaled to the true number of records); empty cells make no tuple."""
    scale = len(true) / max(len(syn), 1)
    errors = []
    for cols in combinations(range(true.shape[1]), k):
        t_ok = np.all(true[:, cols] >= 0, axis=1)
        s_ok = np.all(syn[:, cols] >= 0, axis=1)
        tk, tc = np.unique(joint_keys(true[t_ok], cols, sizes), return_counts=True)
        sk, sc = np.unique(joint_keys(syn[s_ok], cols, sizes), return_counts=True)
        keys = np.union1d(tk, sk)
        t = np.zeros(len(keys))
        s = np.zeros(len(keys))
        t[np.searchsorted(keys, tk)] = tc
        s[np.searchsorted(keys, sk)] = sc * scale
        errors.append(np.abs(t - s))
    return float(np.concatenate(errors).mean())


def domain_codes(codes: np.ndarray, domain: Domain) -> np.ndarray:
    """-1 (empty) back to the NULL code where the column is nullable (fidelity's coding)."""
    out = codes.copy()
    for j, attribute in enumerate(domain.attributes):
        if attribute.null_code is not None:
            out[out[:, j] < 0, j] = attribute.null_code
    return out


def measures(true: np.ndarray, syn: np.ndarray, domain: Domain,
             released: set[tuple[int, int]]) -> dict[str, float]:
    sizes = np.array([a.bins for a in domain.attributes])
    never_empty = np.all(true >= 0, axis=0)
    scored = fidelity.score(domain_codes(true, domain), domain_codes(syn, domain),
                            [a.size for a in domain.attributes])
    present = {(c, v) for c in range(syn.shape[1]) for v in np.unique(syn[:, c]) if v >= 0}
    return {
        "mae1": tuple_mae(true, syn, sizes, 1),
        "mae2": tuple_mae(true, syn, sizes, 2),
        "mae3": tuple_mae(true, syn, sizes, 3),
        "workload2": scored.workload_error,
        "logdisc2": float(np.median(scored.d[scored.order == 2])),
        "logd2_nz": float(np.median(scored.d[(scored.order == 2)
                                              & ((scored.true > 0) | (scored.synthetic > 0))])),
        "empty%": 100 * float((syn[:, never_empty] < 0).mean()),
        "lost": float(len(released - present)),
    }


# --------------------------------------------------------------------------- the two tools


def run_dpsql(workdir: Path, name: str, epsilon: float, options: dict[str, str],
              seed: int) -> tuple[np.ndarray, set, dict[str, float]]:
    """Fit and sample in a fresh process (so its peak memory is its own)."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(_dpsql_child, (workdir, name, epsilon, options, seed))


def _dpsql_child(workdir: Path, name: str, epsilon: float, options: dict[str, str],
                 seed: int) -> tuple[np.ndarray, set, dict[str, float]]:
    store, domain, _ = build_store(name, workdir)
    try:
        dataset = active_policy(store).dataset(name)
        synth = get("sds", **options)
        rng = np.random.default_rng(seed)
        start = time.perf_counter()
        fitted = synth.fit(bounded_relation(store, dataset), domain,
                           rho_from_epsilon_delta(epsilon, DELTA), rng)
        fit_done = time.perf_counter()
        table = fitted.sample(fitted.rows, rng)
        done = time.perf_counter()
    finally:
        store.close()
    codes = np.stack([table.column(a.name).to_numpy() for a in domain.attributes], axis=1)
    ones = fitted.aggregates.levels[0].rows[:, 0] if fitted.aggregates.levels else []
    released = {(int(fitted.items.column[i]), int(fitted.items.code[i])) for i in ones}
    timing = {"fit_s": fit_done - start, "sample_s": done - fit_done, "total_s": done - start,
              "peak_mb": peak_rss_mb()}
    return empty_as_minus_one(codes, domain), released, timing


def run_pacsynth(true: np.ndarray, domain: Domain, epsilon: float,
                 workdir: Path) -> tuple[np.ndarray, set, dict[str, float]]:
    names = list(domain.names)
    source = workdir / "input.csv"
    lines = [",".join(names)]
    lines += [",".join("" if v < 0 else str(v) for v in row) for row in true.tolist()]
    source.write_text("\n".join(lines) + "\n")
    subprocess.run([str(PACSYNTH_PYTHON), str(RUNNER), str(source), str(workdir), str(epsilon),
                    str(DELTA), str(LENGTH)], check=True)
    run = json.loads((workdir / "run.json").read_text())
    text = (workdir / "synthetic.csv").read_text().splitlines()
    header = text[0].split(",")
    order = [header.index(n) for n in names]
    rows = [line.split(",") for line in text[1:]]
    syn = np.array([[int(r[j]) if r[j] != "" else -1 for j in order] for r in rows],
                   dtype=np.int64).reshape(-1, len(names))
    released = set()
    for key in json.loads((workdir / "aggregates.json").read_text()):
        if ";" not in key:
            column, value = key.split(":", 1)
            released.add((names.index(column), int(value)))
    timing = {"fit_s": run["fit_seconds"], "sample_s": run["sample_seconds"],
              "total_s": run["fit_seconds"] + run["sample_seconds"], "peak_mb": run["peak_mb"]}
    return syn, released, timing


# --------------------------------------------------------------------------- report

COLUMNS = ["mae1", "mae2", "mae3", "workload2", "logdisc2", "logd2_nz", "empty%", "lost",
           "total_s", "peak_mb"]


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default="adult,acs")
    parser.add_argument("--epsilons", default="1,4")
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell (median shown)")
    parser.add_argument("--pacsynth-repeats", type=int, default=None,
                        help="pac-synth runs per cell (default: --repeats)")
    parser.add_argument("--option", action="append", default=[], help="dpsql sds option k=v")
    parser.add_argument("--skip-pacsynth", action="store_true")
    args = parser.parse_args()
    options = dict(o.split("=", 1) for o in args.option)
    if not args.skip_pacsynth and not PACSYNTH_PYTHON.exists():
        sys.exit(f"pac-synth venv missing at {PACSYNTH_PYTHON}; see this file's docstring")
    print(f"reporting length {LENGTH}, delta {DELTA}, median of {args.repeats} runs "
          f"(pac-synth: {args.pacsynth_repeats or args.repeats}); dpsql options "
          f"{options or 'default'}; fit+sample seconds and peak resident MB per process")
    print("workload2 = dpsql.analysis.fidelity's workload error (mean half-L1 distance of the "
          "normalized 2-way tables); logdisc2 = median of its log discrepancy "
          "|ln((s+1)/(t+1))| over all 2-way cells (logd2_nz: over the cells non-zero in either "
          "table); empty cells of a nullable column are its NULL category, of another column "
          "count in no cell")
    header = f"{'data':6} {'eps':>4} {'tool':8} " + " ".join(f"{c:>9}" for c in COLUMNS)
    compared: list[tuple[dict[str, float], dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.datasets.split(","):
            store, domain, true = build_store(name, work)
            store.close()  # each run opens it in its own process
            print(f"\n{name}: {len(true)} records, {len(domain)} columns")
            print(header)
            for eps in (float(e) for e in args.epsilons.split(",")):
                results = {}
                for tool in ("dpsql", "pacsynth"):
                    if tool == "pacsynth" and args.skip_pacsynth:
                        continue
                    runs = []
                    repeats = args.repeats
                    if tool == "pacsynth" and args.pacsynth_repeats is not None:
                        repeats = args.pacsynth_repeats
                    for seed in range(repeats):
                        if tool == "dpsql":
                            syn, released, timing = run_dpsql(work, name, eps, options, seed)
                        else:
                            syn, released, timing = run_pacsynth(true, domain, eps, work)
                        runs.append({**measures(true, syn, domain, released), **timing})
                    results[tool] = median_of(runs)
                    print(f"{name:6} {eps:>4g} {tool:8} "
                          + " ".join(f"{results[tool][c]:>9.4g}" for c in COLUMNS), flush=True)
                if "pacsynth" in results:
                    compared.append((results["dpsql"], results["pacsynth"]))
                    ratio = {c: _ratio(results["dpsql"][c], results["pacsynth"][c])
                             for c in COLUMNS}
                    print(f"{name:6} {eps:>4g} {'ratio':8} "
                          + " ".join(f"{ratio[c]:>9.3g}" for c in COLUMNS), flush=True)
    if compared:
        readme_line(compared, args)


def readme_line(compared: list[tuple[dict[str, float], dict[str, float]]],
                args: argparse.Namespace) -> None:
    """The README's figure, over every dataset and epsilon compared (dpsql, pac-synth)."""
    accuracy = [c for c in COLUMNS if c not in ("total_s", "peak_mb")]
    worse = sorted({c for ours, theirs in compared for c in accuracy if ours[c] > theirs[c]})
    smaller = [theirs[c] / ours[c] for ours, theirs in compared for c in ("mae1", "mae2", "mae3")
               if ours[c] > 0]
    readme(f"{args.datasets}, eps {args.epsilons}, median of {args.repeats} runs: "
           + (f"worse on {', '.join(worse)}" if worse else "at least as accurate on every measure")
           + f" ({span(smaller, '.0f')}x smaller tuple errors), "
           f"empty cells {span([ours['empty%'] for ours, _ in compared], '.1f')}%, "
           f"{span([theirs['total_s'] / ours['total_s'] for ours, theirs in compared], '.0f')}x "
           "faster")


def _ratio(ours: float, theirs: float) -> float:
    if theirs == 0:
        return 1.0 if ours == 0 else math.inf
    return ours / theirs


if __name__ == "__main__":
    main()
