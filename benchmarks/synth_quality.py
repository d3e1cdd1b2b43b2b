"""Fidelity and speed of every registered synthesizer, next to the bootstrap ideal.

Datasets (the full files under ../shared/data):
- adult: the 10 Adult columns of the NAPSU-MQ paper (age and hours-per-week in 5
  buckets, capital gain/loss as "positive or not"), 48,842 rows;
- acs: every column of the NIST ACS excerpt national2019.csv (policies/acs.yaml),
  27,253 rows;
- acs10: the same rows, its 10 demographic columns (ACS10 below; the others hidden).

For each synthesizer, epsilon and seed: fit on the bounded source (zCDP, delta
1e-6), sample as many rows as the synthesizer estimates, and score all 1-way and
2-way crosstab cells (dpsql.analysis.fidelity). Prints the mean (and sd over
seeds) of the 2-way workload error, the median log discrepancy d, and median
fit and sample times. Synthesizers that refuse (e.g. a joint table too large)
say why; representations that are not rows (range) are skipped. With
--coverage M, napsu_mq also draws M copies and reports how often Rubin's-rules
95% intervals of every 1-way share cover the real share (the issue's coverage
check, on every dataset of the run). New
synthesizers appear here by registering (``aim`` and ``mst`` need the synth
extra). With --reference-mst, the MST script of benchmarks/_mst_baseline.py
(private-pgm's estimation, numpy noise: a reference, not a release) runs on
the same codes and rho, and its workload error and time are printed below; with
--reference-snsynth aim,mst, smartnoise-synth's AIM and MST (pip, in
/work/venvs/smartnoise: benchmarks/_snsynth_runner.py) at the same epsilon and delta.

    python benchmarks/synth_quality.py                  # everything (slow synthesizers too)
    python benchmarks/synth_quality.py --synth independent,joint --seeds 2
    python benchmarks/synth_quality.py --synth napsu_mq --option napsu_mq.inference=laplace
    python benchmarks/synth_quality.py --datasets adult,acs10 --synth napsu_mq --coverage 10
    python benchmarks/synth_quality.py --datasets adult --epsilons 1 --synth independent,mst,aim \
        --reference-mst
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import adult10_policy, peak_rss_mb, print_table, readme, shared_data

import dpsql
from dpsql import synth
from dpsql.analysis import rubin
from dpsql.analysis.fidelity import bootstrap_ideal, fetch_codes, score
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation, bounded_sql
from dpsql.errors import DPSQLError
from dpsql.privacy import budget_cost

ROOT = Path(__file__).resolve().parents[1]
DELTA = 1e-6
SNSYNTH = Path("/work/venvs/smartnoise/bin/python")  # smartnoise-synth 1.0.8, its own venv


#: the demographic columns of the ACS excerpt: the issue's "ACS national2019 (10 columns)"
ACS10 = ("agep", "sex", "msp", "hisp", "rac1p", "noc", "npf", "housing_type", "own_rent", "edu")


def _acs_policy(names: list[str], keep: tuple[str, ...] | None = None) -> str:
    text = (ROOT / "policies" / "acs.yaml").read_text()
    text = text.replace("budget: {epsilon: 10}", "budget: {epsilon: .inf}")
    text = text.replace("acs: {epsilon: 8}", "acs: {epsilon: .inf}")
    text = text.replace("acs: {epsilon: 2}", "acs: {epsilon: 1}")
    text = text.replace("synthesizers: [independent, joint, range, sds, napsu_mq, modp]",
                        f"synthesizers: [{', '.join(names)}]")
    text = text.replace("allow_non_dp: false", "allow_non_dp: true")
    if keep is None:
        return text
    raw = yaml.safe_load(text)  # every other column hidden: not in the domain, never read
    columns = raw["datasets"]["acs"]["columns"]
    for name in columns:
        if name not in keep:
            columns[name] = {"type": "hidden"}
    return yaml.safe_dump(raw, sort_keys=False)


def build_store(directory: Path, dataset: str, names: list[str]) -> Path:
    """A store holding one dataset with an unbounded admin budget."""
    policy = directory / f"{dataset}.yaml"
    path = directory / f"{dataset}.duckdb"
    if dataset == "adult":
        extra = f"    synthesizers: [{', '.join(names)}]\n    allow_non_dp: true\n"
        policy.write_text(adult10_policy("{epsilon: .inf}", extra))
        store, _ = dpsql.init(path, policy, {"adult": shared_data("adult", "adult.csv")})
    else:
        policy.write_text(_acs_policy(names, ACS10 if dataset == "acs10" else None))
        store, _ = dpsql.init(path, policy, {"acs": shared_data("acs", "national2019.csv")}, na="N")
    store.close()
    return path


def run_one(name: str, source: Any, domain: Domain, epsilon: float, seed: int,
            true_codes: np.ndarray, options: dict[str, str], coverage: int = 0
            ) -> dict[str, Any]:
    """Fit, sample and score one synthesizer once.

    ``coverage`` > 1: for a synthesizer whose copies are posterior draws
    (``copies_are_draws``), also the coverage of Rubin's-rules intervals from that
    many copies (:func:`cell_coverage`).
    """
    synthesizer = synth.get(name, **options)
    if getattr(synthesizer, "output", "rows") != "rows":
        return {"skip": "counts, not rows: benchmarks/range_queries.py"}
    cost = budget_cost("zcdp", epsilon=epsilon, delta=DELTA)
    rng = np.random.default_rng(seed)
    try:
        check = getattr(synthesizer, "check", None)
        if callable(check):
            check(domain, cost)
        start = time.perf_counter()
        fitted = synthesizer.fit(source, domain, cost, rng)
        fit_s = time.perf_counter() - start
        start = time.perf_counter()
        sample = fitted.sample(int(fitted.rows), rng)
        sample_s = time.perf_counter() - start
    except DPSQLError as err:
        reason = str(err).split(";")[0]
        if "cells" in reason:  # keep the size, drop the column list
            reason = reason[reason.index(" has ") + 5:]
        return {"skip": f"refused: {reason}"}
    codes = _codes(sample, domain)
    summary = score(true_codes, codes, domain.shape).summary()
    out = {"workload": summary["workload_error"], "median_d": summary["median_d"],
           "workload3": workload_3way(true_codes, codes, domain.shape),
           "fit_s": fit_s, "sample_s": sample_s}
    out.update(napsu_cost_figures(fitted))
    if coverage > 1 and name in COPIES_ARE_DRAWS:
        copies = [codes] + [_codes(fitted.sample(int(fitted.rows), rng), domain)
                            for _ in range(coverage - 1)]
        out["coverage"] = cell_coverage(true_codes, copies, domain.shape)
    return out


def napsu_cost_figures(fitted: Any) -> dict[str, Any]:
    """A NUTS fit's pre-charge time estimate beside what it did, so a long run can
    recalibrate ``LEAPFROG_STEPS`` (dpsql/synth/napsu_mq/estimate.py): leapfrog steps an
    iteration over every phase (pilot and real run, warmup included, as the estimate
    counts them), the sampling phase's mean and max, and the wall time a step."""
    info = getattr(fitted, "info", None)
    nuts = (info or {}).get("diagnostics", {}).get("nuts")
    if not nuts:
        return {}
    phases = [nuts, *([nuts["pilot"]] if "pilot" in nuts else [])]
    total = sum(p["leapfrog_steps"]["warmup"] + p["leapfrog_steps"]["sampling"]
                for p in phases)
    options = info["parameters"]
    iterations = sum(int(options.get(k, 0)) for k in
                     ("pilot_warmup", "pilot_samples", "warmup", "samples"))
    chains = int(options.get("chains", 1))
    timings = getattr(fitted, "timings", {}) or {}
    figures = {"estimate_min": info["estimate"]["minutes"],
               "parameters": info["estimate"]["parameters"],
               "steps_all": total / max(1, chains * iterations),
               "steps_mean": nuts["leapfrog_steps"]["mean_per_iteration"],
               "steps_max": nuts["leapfrog_steps"]["max_per_iteration"],
               "ms_per_step": timings.get("nuts_ms_per_leapfrog_step"),
               "laplace_s": timings.get("laplace")}
    print(f"  napsu_mq cost figures: {json.dumps(figures)}", file=sys.stderr, flush=True)
    return figures


#: synthesizers whose copies are independent posterior draws (Rubin's rules apply)
COPIES_ARE_DRAWS = ("napsu_mq",)


def _codes(sample: Any, domain: Domain) -> np.ndarray:
    return np.stack([sample.column(n).to_numpy() for n in domain.names], axis=1)


def cell_coverage(true_codes: np.ndarray, copies: list[np.ndarray], shape: tuple[int, ...]
                  ) -> tuple[float, int, int]:
    """How often Rubin's-rules 95% intervals from ``copies`` cover the real 1-way shares.

    Every cell of every column is one estimand: its share of rows, estimated in
    each copy with the binomial variance p(1 - p) / n, combined with
    dpsql.analysis.rubin.combine. Returns (coverage, cells, unreliable cells).
    """
    n = len(true_codes)
    hits, unreliable = [], 0
    for column, size in enumerate(shape):
        truth = np.bincount(true_codes[:, column] + 1, minlength=size + 1) / n
        shares = np.array([np.bincount(c[:, column] + 1, minlength=size + 1) / len(c)
                           for c in copies])
        for cell in range(size + 1):
            if truth[cell] == 0 and not shares[:, cell].any():
                continue  # an empty cell everywhere: nothing to estimate
            estimates = shares[:, cell]
            variances = estimates * (1 - estimates) / np.array([len(c) for c in copies])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", rubin.RubinWarning)
                combined = rubin.combine(estimates, variances,
                                         rows_ratio=float(np.mean([len(c) for c in copies])) / n)
            unreliable += combined.unreliable
            hits.append(combined.ci_low <= truth[cell] <= combined.ci_high)
    return float(np.mean(hits)), len(hits), unreliable


def workload_3way(true_codes: np.ndarray, codes: np.ndarray, shape: tuple[int, ...]) -> float:
    """Mean half-L1 distance of the normalised 3-way tables (codes -1, NULL, are a cell)."""
    errors = []
    for columns in combinations(range(len(shape)), 3):
        dims = tuple(shape[c] + 1 for c in columns)
        tables = [np.bincount(np.ravel_multi_index(tuple(m[:, c] + 1 for c in columns), dims),
                              minlength=math.prod(dims)) / len(m) for m in (true_codes, codes)]
        errors.append(0.5 * np.abs(tables[0] - tables[1]).sum())
    return float(np.mean(errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="adult,acs")
    parser.add_argument("--epsilons", default="0.3,1,3")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--synth", default=None, help="comma-separated (default: all)")
    parser.add_argument("--option", action="append", default=[], metavar="SYNTH.KEY=VALUE",
                        help="a synthesizer option, e.g. napsu_mq.inference=laplace (repeatable)")
    parser.add_argument("--reference-mst", action="store_true",
                        help="also run benchmarks/_mst_baseline.py (needs mbi)")
    parser.add_argument("--reference-snsynth", default="", metavar="aim,mst",
                        help=f"also run smartnoise-synth's AIM and/or MST (from {SNSYNTH})")
    parser.add_argument("--coverage", type=int, default=0, metavar="COPIES",
                        help="also check napsu_mq's 95%% Rubin intervals of every 1-way share "
                        "against the real data, from this many copies (e.g. 10)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = args.synth.split(",") if args.synth else synth.available()
    options: dict[str, dict[str, str]] = {}
    for item in args.option:
        target, _, setting = item.partition(".")
        key, equals, value = setting.partition("=")
        if not equals or target not in names:
            parser.error(f"--option {item!r}: expected SYNTH.KEY=VALUE for one of {names}")
        options.setdefault(target, {})[key] = value
    epsilons = [float(e) for e in args.epsilons.split(",")]
    rows: list[dict[str, Any]] = []
    references: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dpsql-bench-") as tmp:
        for dataset in args.datasets.split(","):
            path = build_store(Path(tmp), dataset, names)
            with dpsql.connect(path, "admin") as admin:
                ds = admin.policy.dataset("acs" if dataset == "acs10" else dataset)
                domain = Domain.from_dataset(ds)
                source = bounded_relation(admin.store, ds)
                true = fetch_codes(admin.store.cursor(),
                                   domain.encode_sql(bounded_sql(ds, admin.store.secret)),
                                   list(domain.names))
                ideal = [bootstrap_ideal(true, domain.shape, np.random.default_rng(s)).summary()
                         for s in range(args.seeds)]
                resamples = [true[np.random.default_rng(s).integers(0, len(true), len(true))]
                             for s in range(args.seeds)]
                rows.append(_row(dataset, "bootstrap ideal", None,
                                 [{"workload": i["workload_error"], "median_d": i["median_d"],
                                   "workload3": workload_3way(true, r, domain.shape)}
                                  for i, r in zip(ideal, resamples, strict=True)]))
                for name in names:
                    dp = bool(getattr(synth.get(name, **options.get(name, {})), "is_dp", True))
                    rows_only = getattr(synth.get(name), "output", "rows") == "rows"
                    for epsilon in epsilons if dp and rows_only else [epsilons[0]]:
                        results = [run_one(name, source, domain, epsilon, seed, true,
                                           options.get(name, {}), args.coverage)
                                   for seed in range(args.seeds)]
                        label = name + "".join(f" {k}={v}" for k, v in
                                               options.get(name, {}).items())
                        rows.append(_row(dataset, label if dp else f"{label} (not DP)",
                                         epsilon if dp and rows_only else None, results))
                        _progress(rows[-1])
                if args.reference_mst:
                    references += [_progress(reference_mst(Path(tmp), dataset, true, domain, e,
                                                           args.seeds))
                                   for e in epsilons]
                references += [_progress(reference_snsynth(Path(tmp), dataset, true, domain,
                                                           name, e, args.seeds))
                               for name in filter(None, args.reference_snsynth.split(","))
                               for e in epsilons]
    print_table(rows, args.json)
    for line in references:
        print(line)
    if not args.json:
        print(f"\n{args.seeds} seeds each; zCDP at delta={DELTA:g}; workload error = mean over "
              "2-way marginals of half the L1 distance (workload_3way: over 3-way ones); "
              "median d over all 1- and 2-way cells; "
              f"peak memory {peak_rss_mb():.0f} MB")
        for dataset in args.datasets.split(","):
            readme_line(rows, dataset, "1" if 1.0 in epsilons else f"{epsilons[0]:g}")


def _progress(done: Any) -> Any:
    """Print a finished row or reference line to stderr at once (a run takes hours and may
    be stopped before its table) and hand it back."""
    print("  done " + (done if isinstance(done, str) else " ".join(
        f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in done.items()
        if v not in ("", "-"))), file=sys.stderr, flush=True)
    return done


def reference_mst(tmp: Path, dataset: str, true: np.ndarray, domain: Domain, epsilon: float,
                  seeds: int) -> str:
    """Run benchmarks/_mst_baseline.py on the same codes and rho; one summary line."""
    codes, sizes = _write_codes(tmp, dataset, true, domain)
    rho = float(budget_cost("zcdp", epsilon=epsilon, delta=DELTA).value)
    script = Path(__file__).resolve().parent / "_mst_baseline.py"
    return _reference(f"reference MST (_mst_baseline.py, mbi) {dataset} eps={epsilon:g}",
                      [[sys.executable, str(script), str(codes), str(sizes), repr(rho), str(seed)]
                       for seed in range(seeds)])


def reference_snsynth(tmp: Path, dataset: str, true: np.ndarray, domain: Domain, name: str,
                      epsilon: float, seeds: int) -> str:
    """Run smartnoise-synth's ``name`` (aim or mst) at the same (epsilon, delta); one line."""
    codes, sizes = _write_codes(tmp, dataset, true, domain)
    script = Path(__file__).resolve().parent / "_snsynth_runner.py"
    return _reference(f"smartnoise-synth {name.upper()} {dataset} eps={epsilon:g}",
                      [[str(SNSYNTH), str(script), str(codes), str(sizes), name, repr(epsilon),
                        repr(DELTA), str(seed)] for seed in range(seeds)])


def _write_codes(tmp: Path, dataset: str, true: np.ndarray, domain: Domain) -> tuple[Path, Path]:
    """The true codes as CSV and the domain's sizes as JSON, for a reference script."""
    codes, sizes = tmp / f"{dataset}_codes.csv", tmp / f"{dataset}_domain.json"
    np.savetxt(codes, true, fmt="%d", delimiter=",", header=",".join(domain.names),
               comments="")
    sizes.write_text(json.dumps(dict(zip(domain.names, domain.shape, strict=True))))
    return codes, sizes


def _reference(label: str, commands: list[list[str]]) -> str:
    """Run one reference command per seed; mean workload error and median time."""
    results = []
    for command in commands:
        out = subprocess.run(command, capture_output=True, text=True, timeout=7200,
                             env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        if out.returncode != 0:
            return f"{label}: failed: {out.stderr[-300:]}"
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"  {label} seed {len(results) - 1}: {results[-1]}", file=sys.stderr, flush=True)
    errors = [r["workload_error"] for r in results]
    three = [r["workload_error_3"] for r in results if "workload_error_3" in r]
    return (f"{label}: workload error {statistics.fmean(errors):.4f} "
            f"(sd {statistics.pstdev(errors):.4f})"
            + (f", 3-way {statistics.fmean(three):.4f}" if three else "") + ", median "
            f"{statistics.median(r['seconds'] for r in results):.1f} s, {len(results)} seeds")


def readme_line(rows: list[dict[str, Any]], dataset: str, epsilon: str) -> None:
    """The README's figure: each synthesizer's 2-way workload error at one epsilon."""
    scored = [r for r in rows if r["dataset"] == dataset and r["epsilon"] in (epsilon, "-")
              and r["workload_error"] != "-"]
    readme(f"{dataset}, eps {epsilon}: " + ", ".join(
        f"`{r['synthesizer']}` {r['workload_error']:.3f}" for r in scored))


def _row(dataset: str, name: str, epsilon: float | None, results: list[dict[str, Any]]
         ) -> dict[str, Any]:
    row: dict[str, Any] = {"dataset": dataset, "synthesizer": name,
                           "epsilon": "-" if epsilon is None else f"{epsilon:g}"}
    skipped = [r["skip"] for r in results if "skip" in r]
    if skipped:
        return {**row, "workload_error": "-", "sd": "-", "workload_3way": "-", "median_d": "-",
                "fit_s": "-", "sample_s": "-", "note": skipped[0]}
    workload = [r["workload"] for r in results]
    row["workload_error"] = statistics.fmean(workload)
    row["sd"] = statistics.stdev(workload) if len(workload) > 1 else 0.0
    row["workload_3way"] = statistics.fmean(r["workload3"] for r in results)
    row["median_d"] = statistics.fmean(r["median_d"] for r in results)
    row["fit_s"] = statistics.median(r["fit_s"] for r in results) if "fit_s" in results[0] \
        else "-"
    row["sample_s"] = statistics.median(r["sample_s"] for r in results) \
        if "sample_s" in results[0] else "-"
    covered = [r["coverage"] for r in results if "coverage" in r]
    row["note"] = "" if not covered else (
        f"95% coverage of 1-way shares {statistics.fmean(c[0] for c in covered):.2f} "
        f"({covered[0][1]} cells, {covered[0][2]} unreliable; target 0.95)")
    timed = [r for r in results if "estimate_min" in r]
    if timed:
        row["note"] += ("; " if row["note"] else "") + "; ".join(
            f"estimate {r['estimate_min']:.1f} min for {r['parameters']} parameters, fit "
            f"{r['fit_s'] / 60:.1f} min, {r['steps_all']:.0f} leapfrog steps an iteration "
            f"over all phases (sampling: mean {r['steps_mean']:.0f}, max {r['steps_max']})"
            for r in timed)
    return row


if __name__ == "__main__":
    main()
