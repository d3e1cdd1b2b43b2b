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
2-way workload error of one copy. If private-pgm's ``mbi`` is installed in
/work/venvs/mbi, MST runs on the same data and rho in the same run (``--mst-seeds``
times, benchmarks/_mst_baseline.py) and the ratios are printed. With --twinify, times
the authors' twinify 2.0 (in /work/venvs/twinify) on the same configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import statsmodels.formula.api as smf
from _common import adult10_policy, readme, shared_data, span

import dpsql
from dpsql.analysis import rubin
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.policies import active_policy
from dpsql.policy import Policy
from dpsql.privacy import rho_from_epsilon_delta
from dpsql.store import Store
from dpsql.synth import get
from dpsql.synth.measure import measure_marginals
from dpsql.synth.napsu_mq import posterior as post
from dpsql.synth.napsu_mq.synthesizer import DiagnosticsWarning, FittedNapsuMQ

ROOT = Path(__file__).resolve().parents[1]
ADULT_CSV = shared_data("adult", "adult.csv")

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

ADULT_POLICY = adult10_policy("{epsilon: 10}")
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
    inference = "Laplace" if args.toy_inference == "laplace" else (
        f"NUTS {args.chains}x({args.warmup}+{args.samples}), covariance {args.covariance}"
        f"{tuning_text(args)}")
    print(f"\n== toy: n={n}, full 3-way marginal, {inference}, m={args.toy_copies} copies, "
          f"{args.toy_repeats} repeats, delta=n^-2")
    print(f"{'eps':>5} {'method':<22} {'cover x1':>9} {'cover x2':>9} {'CI width x1':>12} "
          f"{'fit s (median)':>15}")
    covered: dict[str, list[float]] = {}
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
            synth = get("napsu_mq", cliques="x1+x2+x3", select="none",
                        inference=args.toy_inference, covariance=args.covariance,
                        **tuning(args),
                        target_accept=args.target_accept,
                        chains=args.chains, warmup=args.warmup, samples=args.samples)
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
            covered.setdefault(method, []).extend(cov)
            wid = np.median(widths[method], axis=0)
            fit_s = f"{np.median(seconds):15.2f}" if method.startswith("NAPSU") else f"{'':>15}"
            print(f"{eps:5.1f} {method:<22} {cov[0]:9.2f} {cov[1]:9.2f} {wid[0]:12.3f}{fit_s}")
        sys.stdout.flush()
    readme(f"toy n={n}, eps {', '.join(f'{e:g}' for e in args.eps)}, {args.toy_repeats} "
           f"repeats, {args.toy_copies} copies: 95% intervals cover "
           f"{span(covered['NAPSU-MQ + Rubin'], '.2f')} (noise-unaware: "
           f"{span(covered['noise-unaware, 1 copy'], '.2f')})")


# -- adult ----------------------------------------------------------------------------


def adult_store(tmp: Path) -> tuple[Store, Domain, duckdb.DuckDBPyRelation]:
    policy = tmp / "adult.yaml"
    policy.write_text(ADULT_POLICY)
    store, _ = dpsql.init(tmp / "adult.duckdb", policy, {"adult": ADULT_CSV})
    dataset = active_policy(store).datasets["adult"]
    return store, Domain.from_dataset(dataset), bounded_relation(store, dataset)


def encoded(relation: duckdb.DuckDBPyRelation, domain: Domain) -> pd.DataFrame:
    return relation.query("_src", domain.encode_sql("_src")).df().astype(int)


def with_age_midpoint(frame: pd.DataFrame, domain: Domain) -> pd.DataFrame:
    edges = np.asarray(domain["age"].column.edges)
    mids = (edges[:-1] + edges[1:]) / 2
    return frame.assign(age_mid=mids[frame["age"].to_numpy()])


def pair_tables(frame: pd.DataFrame, domain: Domain) -> dict[tuple[str, str], np.ndarray]:
    """Every normalised 2-way marginal of ``frame`` (codes)."""
    out = {}
    for a, b in itertools.combinations(domain.names, 2):
        t = np.zeros((domain[a].size, domain[b].size))
        np.add.at(t, (frame[a].to_numpy(), frame[b].to_numpy()), 1)
        out[(a, b)] = t / t.sum()
    return out


def workload_error(real: dict, synthetic: dict) -> float:
    """Mean half-L1 distance over all 2-way marginals (private-pgm's workload error)."""
    return float(np.mean([0.5 * np.abs(real[k] - synthetic[k]).sum() for k in real]))


def copy_at(fitted: FittedNapsuMQ, phi: np.ndarray, rng: np.random.Generator,
            sampling: str = "random") -> pd.DataFrame:
    """One copy of ``fitted.rows`` records drawn from P_theta at the fixed ``phi``."""
    fixed = dataclasses.replace(fitted, posterior=post.Samples(phi[None, :]), sampling=sampling)
    return fixed.sample(fitted.rows, rng).to_pandas()


def copy_by(fitted: FittedNapsuMQ, sampling: str, rng: np.random.Generator) -> pd.DataFrame:
    """One copy as a release with ``sampling`` draws it (theta from the posterior)."""
    return dataclasses.replace(fitted, sampling=sampling).sample(fitted.rows, rng).to_pandas()


ADULT_CLIQUES = {
    "issue": ADULT_REQUIRED,
    "issue+income": ADULT_REQUIRED + ",income_50k+age,income_50k+race,income_50k+sex",
    "mst": "",
}


def adult_synth(args: argparse.Namespace, cliques: str, **extra: str) -> Any:
    options = {"cliques": cliques, "inference": args.adult_inference,
               "chains": str(args.chains), "warmup": str(args.warmup),
               "samples": str(args.samples), "prior_sd": str(args.prior_sd),
               "select_share": str(args.select_share), "covariance": args.covariance,
               "target_accept": str(args.target_accept),
               **{k: str(v) for k, v in tuning(args).items()},
               **extra}
    return get("napsu_mq", **{k: v for k, v in options.items() if v != ""})


def tuning(args: argparse.Namespace) -> dict[str, int]:
    """The sampler-tuning options (pilot, moves, jumps): they leave the posterior exact."""
    warmup, samples = args.pilot
    return {"pilot_warmup": warmup, "pilot_samples": samples, "moves": args.moves,
            "jumps": args.jumps}


def tuning_text(args: argparse.Namespace) -> str:
    if args.pilot == [0, 0] and args.moves == 1 and not args.jumps:
        return ""
    return (f", pilot {args.chains}x({args.pilot[0]}+{args.pilot[1]}), {args.moves} NUTS "
            f"move(s) and {args.jumps} jump(s) per iteration")


def adult(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store, domain, relation = adult_store(Path(tmp))
        real = encoded(relation, domain)
        n = len(real)
        truth = pair_tables(real, domain)
        rho = rho_from_epsilon_delta(1, 1 / n**2)
        cliques = ADULT_CLIQUES[args.adult_cliques]
        sampler = (f"NUTS {args.chains} chains x ({args.warmup} warmup + {args.samples} samples)"
                   f", covariance {args.covariance}{tuning_text(args)}"
                   if args.adult_inference == "nuts" else "Laplace")
        print(f"\n== adult: n={n}, 10 columns, eps=1, delta=n^-2 (rho={float(rho.value):.5f}), "
              f"cliques {args.adult_cliques!r} + MST (select_share {args.select_share:g}), "
              f"{sampler}, prior sd {args.prior_sd:g}, m={args.adult_copies} copies")
        print(f"  required cliques: {cliques or '(none: MST selects every pair)'}")
        boot = np.random.default_rng(0).integers(0, n, n)
        print(f"  sampling floor (a bootstrap resample of the real data): workload error "
              f"{workload_error(truth, pair_tables(real.iloc[boot], domain)):.4f}")
        # The clique set's own error: the model fitted to (practically) noise-free marginals.
        exact = adult_synth(args, cliques, inference="laplace").fit(
            relation, domain, rho_from_epsilon_delta(1e4, 1 / n**2), np.random.default_rng(1))
        exact_mean = exact.posterior.summary()[0]
        floor = workload_error(truth, pair_tables(copy_at(exact, exact_mean,
                                                          np.random.default_rng(2)), domain))
        print(f"  clique-set floor (eps=1e4, one copy at the mode): workload error {floor:.4f}")
        reference = rubin.copies(with_age_midpoint(real, domain).assign(_copy=0))
        real_fit = smf.logit(ADULT_FORMULA, reference[0]).fit(disp=0)
        rows = []
        hits: dict[str, list[bool]] = {}
        for r in range(args.adult_repeats):
            rng = np.random.default_rng(100 + r)
            t0 = time.perf_counter()
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always", DiagnosticsWarning)
                fitted = adult_synth(args, cliques).fit(relation, domain, rho, rng)
            wall = time.perf_counter() - t0
            info = fitted.describe()
            diag = info["diagnostics"]
            chain = diag.get("nuts") or {}
            copies = [fitted.sample(fitted.rows, rng).to_pandas()
                      for _ in range(args.adult_copies)]
            frames = [with_age_midpoint(c, domain).assign(_copy=i) for i, c in enumerate(copies)]
            table = rubin.fit_formula(pd.concat(frames), ADULT_FORMULA, "logit",
                                      max_std_error=args.max_std_error)
            common = [c for c in table.index if c in real_fit.params.index]
            inside = covers(table.loc[common, "ci_low"].to_numpy(),
                            table.loc[common, "ci_high"].to_numpy(),
                            real_fit.params[common].to_numpy())
            for name, hit in zip(common, inside, strict=True):
                hits.setdefault(name, []).append(bool(hit))
            per_copy = [pair_tables(c, domain) for c in copies]
            pooled = {k: np.mean([t[k] for t in per_copy], axis=0) for k in truth}
            mean = fitted.posterior.summary()[0]
            mode_copy = copy_at(fitted, mean, rng)
            rows.append({"repeat": r, "parameters": info["model"]["parameters"],
                         "cliques": info["model"]["cliques"],
                         "laplace_s": fitted.timings["laplace"],
                         "laplace_iterations": diag["laplace"]["iterations"],
                         "nuts_s": fitted.timings.get("nuts_seconds", 0.0), "chain": chain,
                         "fit_s": wall, "coverage": float(inside.mean()),
                         "coefficients": len(common),
                         "error_mean": workload_error(truth, pair_tables(mode_copy, domain)),
                         "error_copy": workload_error(truth, per_copy[0]),
                         "error_copies": float(np.mean([workload_error(truth, t)
                                                        for t in per_copy])),
                         "error_pooled": workload_error(truth, pooled),
                         "error_rounded": workload_error(truth, pair_tables(
                             copy_by(fitted, "rounded", rng), domain)),
                         "error_predictive": workload_error(truth, pair_tables(
                             copy_by(fitted, "predictive", rng), domain)),
                         "error_rounded_mean": workload_error(truth, pair_tables(
                             copy_at(fitted, mean, rng, "rounded"), domain)),
                         "warnings": diag["warnings"]})
            row = rows[-1]
            sampler_text = ""
            if chain:
                steps = chain["leapfrog_steps"]
                sampler_text = (
                    f" nuts={row['nuts_s']:.1f}s (compile+first chunk "
                    f"{fitted.timings['nuts_compile_and_first_chunk_seconds']:.1f}s, "
                    f"{steps['mean_per_iteration']:.1f} leapfrog/it, "
                    f"{fitted.timings['nuts_ms_per_leapfrog_step']:.2f} ms/leapfrog/chain on "
                    f"{chain['workers']} threads, step sizes "
                    f"{' '.join(f'{s:.3f}' for s in chain['step_size'])}) "
                    f"max R-hat={chain['max_rhat']:.4f} min ESS={chain['min_ess']:.0f} "
                    f"divergences={chain['divergences']}")
                if chain.get("pilot"):
                    sampler_text += (f" [pilot {fitted.timings['nuts_pilot_seconds']:.1f}s "
                                     "included; "
                                     f"{chain['jump_directions']} jump directions]")
                if chain["covariance"] == "corrected" or chain["jumps"]:
                    sampler_text += (f" correction acceptance "
                                     f"{chain['correction_accept_rate']:.2f}, accepted jumps "
                                     f"{chain['accepted_jumps_per_iteration']:.2f}/it")
            print(f"repeat {r}: parameters={row['parameters']} laplace={row['laplace_s']:.1f}s "
                  f"({row['laplace_iterations']} it){sampler_text} "
                  f"covered {int(inside.sum())} of {row['coefficients']} coefficients")
            print(f"  workload error: copy at the posterior mean {row['error_mean']:.4f}, "
                  f"copy 0 {row['error_copy']:.4f}, mean over copies {row['error_copies']:.4f}, "
                  f"pooled copies {row['error_pooled']:.4f}; sampling=rounded: one copy "
                  f"{row['error_rounded']:.4f}, at the posterior mean "
                  f"{row['error_rounded_mean']:.4f}; sampling=predictive: one copy "
                  f"{row['error_predictive']:.4f}")
            print(f"  cliques: {row['cliques']}")
            for message in row["warnings"]:
                print(f"  warning: {message}")
            sys.stdout.flush()
        print(f"coverage of the real-data coefficients over {len(rows)} repeat(s), "
              f"95% intervals (target 0.95):")
        for name, values in hits.items():
            print(f"  {name:<22} {np.mean(values):.2f} ({sum(values)}/{len(values)})")
        print(f"  {'all':<22} {np.mean([v for vs in hits.values() for v in vs]):.2f}")

        def med(key: str) -> float:
            return float(np.median([r[key] for r in rows]))

        summary = (f"adult summary over {len(rows)} repeat(s): Laplace median "
                   f"{med('laplace_s'):.1f} s (target <= 60 s)")
        if args.adult_inference == "nuts":
            summary += (f", NUTS median {med('nuts_s') / 60:.1f} min (target <= 20 min), max "
                        f"R-hat {max(r['chain']['max_rhat'] for r in rows):.4f} "
                        "(target <= 1.01)")
        print(summary)
        nuts = (f"; NUTS {args.chains} x ({args.warmup} + {args.samples}) "
                f"{med('nuts_s') / 60:.1f} min, R-hat up to "
                f"{max(r['chain']['max_rhat'] for r in rows):.4f}"
                if args.adult_inference == "nuts" else "")
        readme(f"Adult {n:,} rows, the 10 coarsened columns of benchmarks/_common.py, "
               f"{len(rows)} repeat(s): Laplace step {med('laplace_s'):.1f} s{nuts}; "
               f"sampling=predictive one copy {med('error_predictive'):.4f}, default copies "
               f"{med('error_copy'):.4f}")
        print(f"workload error (medians; issue's reference: MST 0.023, AIM 0.007): copy at the "
              f"posterior mean {med('error_mean'):.4f}, one copy {med('error_copy'):.4f}, mean "
              f"over copies {med('error_copies'):.4f}, pooled copies {med('error_pooled'):.4f}; "
              f"sampling=rounded: one copy {med('error_rounded'):.4f}, at the posterior mean "
              f"{med('error_rounded_mean'):.4f}; sampling=predictive: one copy "
              f"{med('error_predictive'):.4f}; "
              f"clique-set floor {floor:.4f}, sampling floor (bootstrap) "
              f"{workload_error(truth, pair_tables(real.iloc[boot], domain)):.4f}; "
              f"peak RSS {peak_mb():.0f} MB")
        store.close()
        if args.mst_seeds:
            mst_baseline(args, real, domain, float(rho.value),
                         {"one copy (sampling=random, the default)": med("error_copy"),
                          "one copy, sampling=rounded": med("error_rounded"),
                          "one copy, sampling=predictive": med("error_predictive"),
                          "copy at the posterior mean": med("error_mean"),
                          "copy at the posterior mean, rounded": med("error_rounded_mean")})
        if args.twinify:
            twinify(args, med("nuts_s") + med("laplace_s"))


MBI = Path("/work/venvs/mbi/bin/python")


def mst_baseline(args: argparse.Namespace, real: pd.DataFrame, domain: Domain, rho: float,
                 ours: dict[str, float]) -> None:
    """MST (private-pgm's estimation, in its own venv) on the same codes and rho."""
    if not MBI.exists():
        print("MST: mbi is not installed in /work/venvs/mbi; skipped")
        return
    script = ROOT / "benchmarks" / "_mst_baseline.py"
    errors, seconds = [], []
    with tempfile.TemporaryDirectory() as tmp:
        data, sizes = Path(tmp) / "codes.csv", Path(tmp) / "domain.json"
        real.to_csv(data, index=False)
        sizes.write_text(json.dumps({c: domain[c].size for c in domain.names}))
        for seed in range(args.mst_seeds):
            out = subprocess.run([str(MBI), str(script), str(data), str(sizes), repr(rho),
                                  str(seed)], capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                print("MST failed:", out.stderr.strip().splitlines()[-1:])
                return
            result = json.loads(out.stdout.strip().splitlines()[-1])
            errors.append(result["workload_error"])
            seconds.append(result["seconds"])
    mst = float(np.median(errors))
    print(f"\n== MST in the same run (mbi estimation, rho={rho:.5f}, {args.mst_seeds} seeds): "
          f"workload error median {mst:.4f} ({min(errors):.4f}-{max(errors):.4f}), "
          f"{np.median(seconds):.1f} s")
    for name, value in ours.items():
        print(f"  napsu_mq {name}: {value:.4f}, ratio napsu_mq / MST = {value / mst:.3f}")


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
    parser.add_argument("--target-accept", type=float, default=0.8,
                        help="NUTS target acceptance (0.95 suits covariance=mode)")
    parser.add_argument("--toy-inference", choices=["laplace", "nuts"], default="laplace")
    parser.add_argument("--eps", type=float, nargs="+", default=[0.1, 0.5, 1.0])
    parser.add_argument("--adult-repeats", type=int, default=1)
    parser.add_argument("--adult-copies", type=int, default=100)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=800)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--max-std-error", type=float, default=5.0)
    parser.add_argument("--prior-sd", type=float, default=10.0,
                        help="prior sd of theta for the Adult run (the paper: 10)")
    parser.add_argument("--adult-inference", choices=["nuts", "laplace"], default="nuts")
    parser.add_argument("--covariance", choices=["exact", "mode", "corrected"],
                        default="corrected",
                        help="NUTS likelihood covariance: exact, fixed at the Laplace mode "
                             "(approximate), or corrected (moves with the fixed covariance, "
                             "each iteration corrected to the exact posterior)")
    parser.add_argument("--pilot", type=int, nargs=2, default=[400, 400],
                        metavar=("WARMUP", "SAMPLES"),
                        help="pilot run on the fixed-covariance posterior that whitens and "
                             "starts the real run (0 0: none)")
    parser.add_argument("--moves", type=int, default=3, help="NUTS transitions per iteration")
    parser.add_argument("--jumps", type=int, default=48,
                        help="jumps along cell directions per iteration (needs --pilot)")
    parser.add_argument("--adult-cliques", choices=list(ADULT_CLIQUES), default="issue",
                        help="required cliques: the issue's, the issue's plus income x "
                             "{age, race, sex}, or none (MST selects all)")
    parser.add_argument("--select-share", type=float, default=0.2)
    parser.add_argument("--mst-seeds", type=int, default=5,
                        help="MST baseline runs in /work/venvs/mbi (0: skip)")
    parser.add_argument("--twinify", action="store_true")
    parser.add_argument("--twinify-limit", type=int, default=1500)
    args = parser.parse_args()
    if args.quick:
        args.toy_repeats, args.toy_copies, args.eps = 5, 10, [1.0]
        args.adult_copies, args.chains, args.warmup, args.samples = 10, 2, 100, 100
        args.mst_seeds = min(args.mst_seeds, 1)
    print(json.dumps({"argv": sys.argv[1:]}))
    if not args.skip_toy:
        toy(args)
    if not args.skip_adult:
        adult(args)


if __name__ == "__main__":
    main()
