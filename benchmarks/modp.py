"""MODP on the ACS excerpt (national2019.csv): crosstab fidelity, training time, privacy.

All columns but the weights; agep, density, pincp and povpip binned at the data's
deciles (like the paper's STUMS), noc and npf at their policy's unit bins, every
other column categorical, 'N' as its own (NULL) category. The decile edges come
from the data, which a real DP release may not do: here they only fix one
domain on which every method is scored.

Rows printed: the bootstrap ideal (a resample of the real rows), the
independent-histogram baseline (DP one-way marginals at each epsilon), MODP
empirical (1 and 5 blades) and MODP DP (1 and 5 blades at each epsilon).
Fidelity is dpsql.analysis.fidelity's: the paper's log discrepancy
d = |log((C_syn + 1) / (C_true + 1))| over every cell of every 1-way and 2-way
crosstab, median, mean and r.m.s. Over half of those cells are empty in the
real and in the resampled table, so the ideal's median is 0; the ``ne_*``
columns score the same d over the cells non-empty in either table, and
``x_ideal`` is ``ne_median`` over the ideal's. Each synthetic table has as
many rows as the real one. One run per row: training takes minutes.

    nice python benchmarks/modp.py [--quick] [--json] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import peak_rss_mb, print_table, readme

import dpsql
from dpsql.analysis import fidelity
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.privacy import PrivacyCost, rho_from_epsilon_delta
from dpsql.synth import get
from dpsql.synth.modp.synthesizer import read_codes

ROOT = Path(__file__).resolve().parents[1]
# ../shared beside the checkout (a clone), or beside the folder of worktrees
DATA = next((d / "shared" / "data" / "acs" / "national2019.csv" for d in ROOT.parents
               if (d / "shared" / "data" / "acs" / "national2019.csv").exists()),
              ROOT.parent / "shared" / "data" / "acs" / "national2019.csv")
DECILE_COLUMNS = ("agep", "density", "pincp", "povpip")
DELTA = 1e-6


# -- data -------------------------------------------------------------------------------
def decile_policy(target: Path) -> Path:
    """policies/acs.yaml with decile bins for the continuous columns; non-DP allowed."""
    policy = yaml.safe_load((ROOT / "policies" / "acs.yaml").read_text())
    frame = pd.read_csv(DATA, na_values=["N"], keep_default_na=False)
    frame.columns = [c.lower() for c in frame.columns]
    columns = policy["datasets"]["acs"]["columns"]
    for name in DECILE_COLUMNS:
        spec = columns[name]
        lo, hi = spec["bounds"]
        values = frame[name].dropna().to_numpy(dtype=float)
        inner = np.quantile(values, np.linspace(0.1, 0.9, 9))
        if spec["type"] == "integer":
            inner = np.round(inner)
        edges = sorted({float(e) for e in inner if lo < e < hi})
        spec["bins"] = [lo, *edges, hi]
    policy["datasets"]["acs"]["allow_non_dp"] = True
    target.write_text(yaml.safe_dump(policy, sort_keys=False))
    return target


# -- scoring ----------------------------------------------------------------------------
def scores(true_codes: np.ndarray, codes: np.ndarray, sizes: tuple[int, ...]) -> dict[str, float]:
    """dpsql.analysis.fidelity over every 1-way and 2-way cell, and the same log discrepancy
    over the cells non-empty in either table (``ne_*``)."""
    fid = fidelity.score(true_codes, codes, sizes)
    out = fid.summary()
    cells = (fid.true > 0) | (fid.synthetic > 0)
    d = fid.d[cells]
    out.update(ne_median=float(np.median(d)), ne_mean=float(d.mean()),
               ne_rms=float(np.sqrt((d**2).mean())), ne_cells=float(cells.sum()))
    return out


def table_codes(table: Any, names: tuple[str, ...]) -> np.ndarray:
    return np.stack([table.column(n).to_numpy() for n in names], axis=1)


# -- runs -------------------------------------------------------------------------------
def independent(relation: Any, domain: Domain, epsilon: float, n: int, seed: int
                ) -> tuple[np.ndarray, float]:
    """The independent-histogram baseline at ``epsilon`` (all of it on the marginals)."""
    budget = rho_from_epsilon_delta(epsilon, DELTA)
    start = time.perf_counter()
    fitted = get("independent").fit(relation, domain, budget, np.random.default_rng(seed))
    seconds = time.perf_counter() - start
    return table_codes(fitted.sample(n, np.random.default_rng(seed + 1)), domain.names), seconds


def modp_run(relation: Any, domain: Domain, budget: PrivacyCost, n: int, seed: int,
             **options: Any) -> tuple[np.ndarray, dict[str, Any], float]:
    synth = get("modp", **options)
    start = time.perf_counter()
    fitted = synth.fit(relation, domain, budget, np.random.default_rng(seed))
    seconds = time.perf_counter() - start
    codes = table_codes(fitted.sample(n, np.random.default_rng(seed + 1)), domain.names)
    described = fitted.describe()
    described["timings"] = getattr(fitted, "timings", {})
    return codes, described, seconds


def privacy_note(described: dict[str, Any]) -> str:
    params = described["parameters"]
    if params["mode"] == "dp":
        rec, timing = params["dpsgd"], described["timings"]
        return (f"rho={float(params['spent']['rho']):.4g} z={rec['noise_multiplier']:.3g} "
                f"steps={rec['steps']}, noise {timing['noise']:.1f}s of "
                f"{timing['noise'] + timing['gradients']:.0f}s")
    diag = described["diagnostics"]
    ranks = diag["hamming_rank"]
    return (f"entropy med {diag['entropy_bits']['quantiles']['0.5']:.1f} bits, "
            f"log10 eff.mult med {diag['log10_effective_multiplicity']['quantiles']['0.5']:.1f}, "
            f"nearest {ranks['fraction_nearest']:.3f}, within10 {ranks['fraction_within_10']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer epochs and steps (smoke)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--epsilons", default="1,4")
    parser.add_argument("--skip-dp", action="store_true", help="no DP-mode runs")
    parser.add_argument("--skip-empirical", action="store_true",
                        help="no empirical-mode runs")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    epochs, steps = (4, 10) if args.quick else (40, 100)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        policy = decile_policy(Path(tmp) / "acs_deciles.yaml")
        store, _ = dpsql.init(Path(tmp) / "acs.duckdb", policy, {"acs": DATA}, na="N")
        store.close()
        with dpsql.connect(Path(tmp) / "acs.duckdb", "admin") as session:
            dataset = session.policy.dataset("acs")
            domain = Domain.from_dataset(dataset)
            relation = bounded_relation(session.store, dataset)
            true_codes = read_codes(relation, domain)
            n = len(true_codes)
            sizes = domain.shape
            print(f"# {n} rows, {len(domain)} columns, {sum(sizes)} categories, "
                  f"torch threads {torch.get_num_threads()}", flush=True)

            def add(method: str, codes: np.ndarray, seconds: float | None = None,
                    note: str = "") -> None:
                got = scores(true_codes, codes, sizes)
                rows.append({"method": method, "median": got["median_d"], "mean": got["mean_d"],
                             "rms": got["rms_d"], "ne_median": got["ne_median"],
                             "ne_mean": got["ne_mean"], "ne_rms": got["ne_rms"],
                             "x_ideal": 0.0, "fit_s": "" if seconds is None else round(seconds, 1),
                             "privacy": note})
                print(f"# {method}: {got}  ({note})", flush=True)

            rng = np.random.default_rng(0)
            add("bootstrap ideal", true_codes[rng.integers(0, n, n)], note="resample")
            for eps in epsilons:
                codes, seconds = independent(relation, domain, eps, n, 1)
                add(f"independent eps={eps:g}", codes, seconds,
                    note=f"DP 1-way marginals, epsilon={eps:g} delta={DELTA:g}")
            for blades in () if args.skip_empirical else (1, 5):
                codes, described, seconds = modp_run(
                    relation, domain, PrivacyCost.zero("zcdp"), n, 2, epochs=epochs,
                    blades=blades)
                add(f"modp empirical {blades} blade{'s' if blades > 1 else ''}", codes, seconds,
                    privacy_note(described))
            if not args.skip_dp:
                for eps in epsilons:
                    budget = rho_from_epsilon_delta(eps, DELTA)
                    for blades in (1, 5):
                        codes, described, seconds = modp_run(
                            relation, domain, budget, n, 3, mode="dp", blades=blades,
                            steps=steps)
                        add(f"modp dp eps={eps:g} {blades} blade{'s' if blades > 1 else ''}",
                            codes, seconds, privacy_note(described))
    ideal = rows[0]["ne_median"]
    for row in rows:
        row["x_ideal"] = row["ne_median"] / ideal
    print_table(rows, args.json)
    print(f"\npeak RSS {peak_rss_mb():.0f} MB; one run per row (training is minutes; "
          "medians over runs would multiply that)")
    if not args.json:
        for row in rows:
            if row["method"].startswith("modp empirical"):
                readme(f"ACS {n:,} rows, {len(sizes)} columns, {epochs} epochs, one run: "
                       f"{row['method']} median log discrepancy {row['x_ideal']:.2f}x the "
                       f"bootstrap ideal, {row['fit_s']:.0f} s training")


if __name__ == "__main__":
    os.nice(10)
    main()
