"""Where ``aim``'s fit time goes: JAX compiling each round's model, against running it.

Every AIM round measures one more marginal, so mbi's mirror descent meets a new
model structure and JAX traces, lowers and compiles it anew. This fits ``aim`` as
``synth_quality.py`` does, sums JAX's compile events during the fit (through
``jax.monitoring``), then re-estimates the final measurements from scratch in the
same process, with the final fit's iterations and its program already compiled:
the mirror descent alone. Prints per seed: fit time, compile time and count, that
re-estimate, selected marginals, 2-way and 3-way workload error; then medians and peak memory.

    python benchmarks/aim_fit_parts.py                       # acs10, eps 1, 3 seeds
    python benchmarks/aim_fit_parts.py --dataset adult --option round_iters=250
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jax.monitoring
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import peak_rss_mb, print_table
from synth_quality import build_store, workload_3way

import dpsql
from dpsql import synth
from dpsql.analysis.fidelity import fetch_codes, score
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation, bounded_sql
from dpsql.privacy import budget_cost
from dpsql.synth import pgm

COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
compile_seconds: Counter[str] = Counter()


def _listen(event: str, duration: float, **_: Any) -> None:
    if event in COMPILE_EVENTS:
        compile_seconds[event] += duration
        compile_seconds["count"] += event == COMPILE_EVENTS[-1]


def fit_once(source: Any, domain: Domain, epsilon: float, seed: int, true: np.ndarray,
             options: dict[str, str]) -> dict[str, Any]:
    """One fit, its compile share, and a re-estimate of its final measurements with
    the program compiled."""
    synthesizer = synth.get("aim", **options)
    compile_seconds.clear()
    start = time.perf_counter()
    fitted = synthesizer.fit(source, domain, budget_cost("zcdp", epsilon=epsilon, delta=1e-6),
                             np.random.default_rng(seed))
    fit_s = time.perf_counter() - start
    compiled = sum(compile_seconds[e] for e in COMPILE_EVENTS)
    count = compile_seconds["count"]
    with pgm.float64() as mbi:
        start = time.perf_counter()
        model = pgm.estimate(mbi, domain, fitted.measured, domain.public_rows, synthesizer.iters)
        pgm.Inference(model, domain)  # waits for the result (JAX dispatches asynchronously)
        warm_s = time.perf_counter() - start
    sample = fitted.sample(int(fitted.rows), np.random.default_rng(seed))
    codes = np.stack([sample.column(n).to_numpy() for n in domain.names], axis=1)
    return {"seed": seed, "fit_s": fit_s, "compile_s": compiled, "compiles": count,
            "rest_s": fit_s - compiled, "final_fit_warm_s": warm_s,
            "picks": len(fitted.diagnostics["rounds"]),
            "workload": score(true, codes, domain.shape).summary()["workload_error"],
            "workload_3way": workload_3way(true, codes, domain.shape)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="acs10", choices=["acs10", "adult"])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an aim option, e.g. round_iters=250 (repeatable)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    options = dict(item.split("=", 1) for item in args.option)
    jax.monitoring.register_event_duration_secs_listener(_listen)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dpsql-bench-") as tmp:
        path = build_store(Path(tmp), args.dataset, ["aim"])
        with dpsql.connect(path, "admin") as admin:
            ds = admin.policy.dataset("acs" if args.dataset == "acs10" else args.dataset)
            domain = Domain.from_dataset(ds)
            true = fetch_codes(admin.store.cursor(),
                               domain.encode_sql(bounded_sql(ds, admin.store.secret)),
                               list(domain.names))
            for seed in range(args.seeds):
                rows.append(fit_once(bounded_relation(admin.store, ds), domain, args.epsilon,
                                     seed, true, options))
                print("  done", rows[-1], file=sys.stderr, flush=True)
    print_table(rows, args.json)
    if not args.json:
        median = {k: statistics.median(r[k] for r in rows) for k in
                  ("fit_s", "compile_s", "final_fit_warm_s")}
        print(f"\n{args.dataset}, eps {args.epsilon:g}, options {options or 'default'}: median "
              f"fit {median['fit_s']:.1f} s, of which JAX compiling {median['compile_s']:.1f} s "
              f"({median['compile_s'] / median['fit_s']:.0%}); the final fit's measurements "
              f"re-estimated warm in {median['final_fit_warm_s']:.2f} s; "
              f"peak memory {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
