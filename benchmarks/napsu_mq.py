"""NAPSU-MQ benchmarks: the paper's toy coverage experiment and its Adult experiment.

    PYTHONPATH=. nice python benchmarks/napsu_mq.py                 # everything (long)
    PYTHONPATH=. python benchmarks/napsu_mq.py --quick              # small smoke version
    PYTHONPATH=. python benchmarks/napsu_mq.py --skip-adult         # toy only

Toy (Räisä et al. 2023, Sec. 5.1): n = 2000, x1, x2 fair coins, x3 ~ logistic(x1),
the full 3-way marginal, Laplace inference, eps in {0.1, 0.5, 1}, delta = n^-2;
the logistic regression of x3 on x1, x2 over m copies combined by Rubin's rules.
Prints the 95% CI coverage of the true coefficients (1, 0) per eps, and the same
for the noise-unaware ablation (the noisy table taken as truth, one copy).

Adult (Supplement E): 10 columns, age and hours in 5 buckets, capital gain/loss
binary; hours x {age, race, sex, income} and race x sex, the rest by MST; eps = 1,
delta = n^-2, NUTS 4 chains x (800 warmup + 2000 samples). Prints wall times, R-hat,
ESS, coverage of the real-data coefficients of income ~ age + race + sex, and the
2-way workload error of one copy. With --twinify, times the authors' twinify 2.0
(in /work/venvs/twinify) on the same configuration.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import statsmodels.formula.api as smf

import dpsql
from dpsql.analysis import rubin
from dpsql.domain import Domain
from dpsql.policy import Policy
from dpsql.privacy import rho_from_epsilon_delta
from dpsql.source import bounded_relation
from dpsql.synth import get
from dpsql.synth.measure import measure_marginals

ROOT = Path(__file__).resolve().parents[1]
ADULT_CSV = ROOT.parent.parent / "shared" / "data" / "adult" / "adult.csv"
if not ADULT_CSV.exists():
    ADULT_CSV = Path("/work/shared/data/adult/adult.csv")

TOY_POLICY = """version: 1
accounting: zcdp
delta: 1.0e-6
datasets:
  toy:
    table: toy
    budget: {epsilon: 10}
    columns:
      x1: {type: categorical, values: [0, 1]}
      x2: {type: categorical, values: [0, 1]}
      x3: {type: categorical, values: [0, 1]}
users:
  admin: {role: admin, budgets: {toy: {epsilon: 10}}}
"""

ADULT_POLICY = """version: 1
accounting: zcdp
delta: 1.0e-6
datasets:
  adult:
    table: adult
    budget: {epsilon: 10}
    columns:
      age: {type: integer, bounds: [0, 84], bins: [0, 17, 34, 51, 68, 84]}
      workclass: {type: categorical, values: [0, 1, 2, 3, 4, 5, 6, 7, 8]}
      education_num: {type: integer, bounds: [0, 15], bins: 1}
      marital_status: {type: categorical, values: [0, 1, 2, 3, 4, 5, 6]}
      race: {type: categorical, values: [0, 1, 2, 3, 4]}
      sex: {type: categorical, values: [0, 1]}
      capital_gain: {type: integer, bounds: [0, 99], bins: [0, 1, 99]}
      capital_loss: {type: integer, bounds: [0, 99], bins: [0, 1, 99]}
      hours_per_week: {type: integer, bounds: [0, 98], bins: [0, 20, 40, 60, 80, 98]}
      income_50k: {type: categorical, values: [0, 1]}
      fnlwgt: {type: hidden}
      occupation: {type: hidden}
      relationship: {type: hidden}
      native_country: {type: hidden}
users:
  admin: {role: admin, budgets: {adult: {epsilon: 10}}}
"""
ADULT_REQUIRED = ("hours_per_week+age,hours_per_week+race,hours_per_week+sex,"
                  "hours_per_week+income_50k,race+sex")
ADULT_FORMULA = "income_50k ~ age_mid + C(race) + sex"


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- toy ------------------------------------------------------------------------------


def toy_data(rng: np.random.Generator, n: int) -> pd.DataFrame:
    x1 = rng.integers(0, 2, n)
    x2 = rng.integers(0, 2, n)
    x3 = (rng.random(n) < 1 / (1 + np.exp(-x1))).astype(int)
    return pd.DataFrame({"x1": x1, "x2": x2, "x3": x3})


def covers(low: np.ndarray, high: np.ndarray, truth: np.ndarray) -> np.ndarray:
    return (low <= truth) & (truth <= high)


def toy(args: argparse.Namespace) -> None:
    n = 2000
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "toy.yaml"
        path.write_text(TOY_POLICY)
        dataset = Policy.load(path).datasets["toy"]
    domain = Domain.from_dataset(dataset)
    truth = np.array([1.0, 0.0])
    print(f"\n== toy: n={n}, full 3-way marginal, Laplace, m={args.toy_copies} copies, "
          f"{args.toy_repeats} repeats, delta=n^-2")
    print(f"{'eps':>5} {'method':<22} {'cover x1':>9} {'cover x2':>9} {'CI width x1':>12} "
          f"{'fit s (median)':>15}")
    for eps in args.eps:
        rho = rho_from_epsilon_delta(eps, 1 / n**2)
        hits = {"NAPSU-MQ + Rubin": [], "noise-unaware, 1 copy": []}
        widths = {k: [] for k in hits}
        seconds = []
        for r in range(args.toy_repeats):
            rng = np.random.default_rng([r, int(eps * 1000)])
            con = duckdb.connect()
            con.register("toy_df", toy_data(rng, n))
            relation = con.sql("SELECT * FROM toy_df")
            synth = get("napsu_mq", cliques="x1+x2+x3", select="none", inference="laplace")
            t0 = time.perf_counter()
            fitted = synth.fit(relation, domain, rho, rng)
            seconds.append(time.perf_counter() - t0)
            frames = [fitted.sample(n, rng).to_pandas().assign(_copy=i)
                      for i in range(args.toy_copies)]
            table = rubin.fit_formula(pd.concat(frames), "x3 ~ x1 + x2", "logit")
            low = table.loc[["x1", "x2"], "ci_low"].to_numpy()
            high = table.loc[["x1", "x2"], "ci_high"].to_numpy()
            hits["NAPSU-MQ + Rubin"].append(covers(low, high, truth))
            widths["NAPSU-MQ + Rubin"].append(high - low)
            # Ablation: the noisy 3-way table taken as the truth, one copy, no Rubin.
            noisy = measure_marginals(relation, domain, [("x1", "x2", "x3")], rho)[0].noisy
            p = np.clip(noisy, 0, None).reshape(-1)
            p = p / p.sum()
            cells = rng.choice(p.size, n, p=p)
            x = np.stack(np.unravel_index(cells, (2, 2, 2)), axis=1)
            one = pd.DataFrame(x, columns=["x1", "x2", "x3"])
            res = smf.logit("x3 ~ x1 + x2", one).fit(disp=0)
            ci = res.conf_int().loc[["x1", "x2"]].to_numpy()
            hits["noise-unaware, 1 copy"].append(covers(ci[:, 0], ci[:, 1], truth))
            widths["noise-unaware, 1 copy"].append(ci[:, 1] - ci[:, 0])
            con.close()
        for method in hits:
            cov = np.mean(hits[method], axis=0)
            wid = np.median(widths[method], axis=0)
            fit_s = f"{np.median(seconds):15.2f}" if method.startswith("NAPSU") else f"{'':>15}"
            print(f"{eps:5.1f} {method:<22} {cov[0]:9.2f} {cov[1]:9.2f} {wid[0]:12.3f}{fit_s}")
        sys.stdout.flush()


# -- adult ----------------------------------------------------------------------------


def adult_store(tmp: Path) -> tuple[dpsql.store.Store, Domain, duckdb.DuckDBPyRelation]:
    policy = tmp / "adult.yaml"
    policy.write_text(ADULT_POLICY)
    store, _ = dpsql.init(tmp / "adult.duckdb", policy, {"adult": ADULT_CSV})
    dataset = store.active_policy().datasets["adult"]
    return store, Domain.from_dataset(dataset), bounded_relation(store, dataset)


def encoded(relation: duckdb.DuckDBPyRelation, domain: Domain) -> pd.DataFrame:
    return relation.query("_src", domain.encode_sql("_src")).df().astype(int)


def with_age_midpoint(frame: pd.DataFrame, domain: Domain) -> pd.DataFrame:
    edges = np.asarray(domain["age"].column.edges)
    mids = (edges[:-1] + edges[1:]) / 2
    return frame.assign(age_mid=mids[frame["age"].to_numpy()])


def workload_error(real: pd.DataFrame, synthetic: pd.DataFrame, domain: Domain) -> float:
    errors = []
    for a, b in itertools.combinations(domain.names, 2):
        shape = (domain[a].size, domain[b].size)
        tables = []
        for frame in (real, synthetic):
            t = np.zeros(shape)
            np.add.at(t, (frame[a].to_numpy(), frame[b].to_numpy()), 1)
            tables.append(t / t.sum())
        errors.append(0.5 * np.abs(tables[0] - tables[1]).sum())
    return float(np.mean(errors))


def adult(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store, domain, relation = adult_store(Path(tmp))
        real = encoded(relation, domain)
        n = len(real)
        rho = rho_from_epsilon_delta(1, 1 / n**2)
        print(f"\n== adult: n={n}, 10 columns, eps=1, delta=n^-2 (rho={float(rho.value):.5f}), "
              f"NUTS {args.chains} chains x ({args.warmup} warmup + {args.samples} samples), "
              f"m={args.adult_copies} copies, prior sd {args.prior_sd:g}")
        reference = rubin.copies(with_age_midpoint(real, domain).assign(_copy=0))
        real_fit = smf.logit(ADULT_FORMULA, reference[0]).fit(disp=0)
        rows = []
        for r in range(args.adult_repeats):
            rng = np.random.default_rng(100 + r)
            synth = get("napsu_mq", cliques=ADULT_REQUIRED, inference="nuts",
                        chains=str(args.chains), warmup=str(args.warmup),
                        samples=str(args.samples), prior_sd=str(args.prior_sd))
            t0 = time.perf_counter()
            fitted = synth.fit(relation, domain, rho, rng)
            wall = time.perf_counter() - t0
            info = fitted.describe()
            diag = info["diagnostics"]
            frames = [with_age_midpoint(fitted.sample(fitted.rows, rng).to_pandas(), domain)
                      .assign(_copy=i) for i in range(args.adult_copies)]
            table = rubin.fit_formula(pd.concat(frames), ADULT_FORMULA, "logit",
                                      max_std_error=args.max_std_error)
            common = [c for c in table.index if c in real_fit.params.index]
            inside = covers(table.loc[common, "ci_low"].to_numpy(),
                            table.loc[common, "ci_high"].to_numpy(),
                            real_fit.params[common].to_numpy())
            error = workload_error(real, frames[0], domain)
            rows.append({"repeat": r, "parameters": info["model"]["parameters"],
                         "cliques": info["model"]["cliques"],
                         "laplace_s": diag["laplace"]["seconds"],
                         "laplace_iterations": diag["laplace"]["iterations"],
                         "nuts_s": diag["nuts"]["seconds"],
                         "nuts_compile_s": diag["nuts"]["compile_and_first_chunk_seconds"],
                         "rhat": diag["nuts"]["max_rhat"], "ess": diag["nuts"]["min_ess"],
                         "divergences": diag["nuts"]["divergences"],
                         "leapfrog_per_iter": diag["nuts"]["leapfrog_steps"]["mean_per_iteration"],
                         "fit_s": wall, "coverage": float(inside.mean()),
                         "coefficients": len(common), "workload_error": error,
                         "warnings": diag["warnings"]})
            row = rows[-1]
            print(f"repeat {r}: parameters={row['parameters']} laplace={row['laplace_s']:.1f}s "
                  f"({row['laplace_iterations']} it) nuts={row['nuts_s']:.1f}s "
                  f"(compile+first chunk {row['nuts_compile_s']:.1f}s, "
                  f"{row['leapfrog_per_iter']:.1f} leapfrog/it) max R-hat={row['rhat']:.4f} "
                  f"min ESS={row['ess']:.0f} divergences={row['divergences']} "
                  f"coverage={row['coverage']:.2f} of {row['coefficients']} coefficients "
                  f"workload error={row['workload_error']:.4f}")
            print(f"  cliques: {row['cliques']}")
            sys.stdout.flush()
        lap = np.median([r["laplace_s"] for r in rows])
        nut = np.median([r["nuts_s"] for r in rows])
        print(f"adult summary over {len(rows)} repeat(s): Laplace median {lap:.1f} s "
              f"(target <= 60 s), NUTS median {nut / 60:.1f} min (target <= 20 min), "
              f"max R-hat {max(r['rhat'] for r in rows):.4f} (target <= 1.01), "
              f"coverage {np.mean([r['coverage'] for r in rows]):.2f}, "
              f"workload error {np.mean([r['workload_error'] for r in rows]):.4f} "
              f"(issue's reference: MST 0.023, AIM 0.007), peak RSS {peak_mb():.0f} MB")
        store.close()
        if args.twinify:
            twinify(args, nut + lap)


def twinify(args: argparse.Namespace, ours: float) -> None:
    python = Path("/work/venvs/twinify/bin/python")
    if not python.exists():
        print("twinify: not installed in /work/venvs/twinify; skipped")
        return
    script = ROOT / "benchmarks" / "twinify_napsu.py"
    print(f"\n== twinify 2.0 on the same configuration (time limit {args.twinify_limit} s)")
    t0 = time.perf_counter()
    try:
        out = subprocess.run([str(python), str(script), str(ADULT_CSV)], capture_output=True,
                             text=True, timeout=args.twinify_limit)
        wall = time.perf_counter() - t0
        print(out.stdout.strip()[-2000:] or out.stderr.strip()[-2000:])
        if out.returncode == 0:
            print(f"twinify total {wall:.0f} s; ratio twinify / dpsql = {wall / ours:.1f}x")
    except subprocess.TimeoutExpired as err:
        wall = time.perf_counter() - t0
        partial = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        print(partial.strip()[-2000:] or "(no phase finished)")
        print(f"twinify did not finish in {wall:.0f} s; ratio twinify / dpsql > "
              f"{wall / ours:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small, fast configuration")
    parser.add_argument("--skip-toy", action="store_true")
    parser.add_argument("--skip-adult", action="store_true")
    parser.add_argument("--toy-repeats", type=int, default=100)
    parser.add_argument("--toy-copies", type=int, default=50)
    parser.add_argument("--eps", type=float, nargs="+", default=[0.1, 0.5, 1.0])
    parser.add_argument("--adult-repeats", type=int, default=1)
    parser.add_argument("--adult-copies", type=int, default=100)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=800)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--max-std-error", type=float, default=5.0)
    parser.add_argument("--prior-sd", type=float, default=10.0,
                        help="prior sd of theta for the Adult run (the paper: 10)")
    parser.add_argument("--twinify", action="store_true")
    parser.add_argument("--twinify-limit", type=int, default=1500)
    args = parser.parse_args()
    if args.quick:
        args.toy_repeats, args.toy_copies, args.eps = 5, 10, [1.0]
        args.adult_copies, args.chains, args.warmup, args.samples = 10, 2, 100, 100
    print(json.dumps({"argv": sys.argv[1:]}))
    if not args.skip_toy:
        toy(args)
    if not args.skip_adult:
        adult(args)


if __name__ == "__main__":
    main()
