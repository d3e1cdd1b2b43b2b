"""NAPSU-MQ on the bundled Adult sample: fit, draw copies, combine a regression.

    PYTHONPATH=. python examples/napsu_adult.py

Builds a zCDP store over the 5,000-row Adult sample, fits NAPSU-MQ with the
income-relevant marginals (plus MST selection) at epsilon = 1, draws 10 synthetic
copies, and fits income ~ age + sex on every copy, combined with Rubin's rules.
The combined intervals are compared with the same regression on the real rows,
which only the data owner can run. Last, one table for browsing rather than
inference (``sampling=predictive``) is compared with a released copy by its 2-way
workload error. NUTS with 4 chains x (1000 + 1000) keeps this to a couple of
minutes.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import statsmodels.formula.api as smf

import dpsql
from dpsql.analysis import fidelity, rubin
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.policies import active_policy
from dpsql.synth import get

SAMPLE = Path(__file__).resolve().parents[1] / "dpsql" / "data" / "adult_sample.csv"
POLICY = """version: 1
accounting: zcdp
delta: 1.0e-6
datasets:
  adult:
    table: adult
    budget: {epsilon: 10}
    columns:
      age: {type: integer, bounds: [0, 84], bins: [0, 17, 34, 51, 68, 84]}
      sex: {type: categorical, values: [0, 1]}
      race: {type: categorical, values: [0, 1, 2, 3, 4]}
      hours_per_week: {type: integer, bounds: [0, 98], bins: [0, 20, 40, 60, 80, 98]}
      income_50k: {type: categorical, values: [0, 1]}
      fnlwgt: {type: hidden}
users:
  admin: {role: admin, budgets: {adult: {epsilon: 10}}}
"""
FORMULA = "income_50k ~ age + sex"


def workload_error(real: pd.DataFrame, synthetic: pd.DataFrame, sizes: list[int]) -> float:
    """Mean half-L1 distance between the normalised 2-way tables of two code frames."""
    return fidelity.workload_error(fidelity.crosstabs(real.to_numpy(), sizes),
                                   fidelity.crosstabs(synthetic[real.columns].to_numpy(), sizes))


def progress(stage: str, done: float, total: float | None = None) -> None:
    if stage != "laplace" and total and done == total:
        print(f"  {stage}: done")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "adult.yaml"
        policy.write_text(POLICY)
        store, _ = dpsql.init(Path(tmp) / "adult.duckdb", policy, {"adult": SAMPLE})
        dataset = active_policy(store).datasets["adult"]
        domain = Domain.from_dataset(dataset)
        relation = bounded_relation(store, dataset)
        budget = dpsql.privacy.budget_cost("zcdp", epsilon=1, delta=1e-6)
        print(f"budget: {budget.describe(1e-6)}")
        synth = get("napsu_mq", cliques="age+income_50k,sex+income_50k,race+sex",
                    inference="nuts", chains="4", warmup="1000", samples="1000")
        rng = np.random.default_rng(2026)
        fitted = synth.fit(relation, domain, budget, rng, progress)
        info = fitted.describe()
        diag = info["diagnostics"]
        print(f"model: {info['model']['parameters']} parameters, cliques "
              f"{info['model']['cliques']}; about {fitted.rows} rows")
        print(f"NUTS: max R-hat {diag['nuts']['max_rhat']:.3f}, min ESS "
              f"{diag['nuts']['min_ess']:.0f}, {fitted.timings['nuts_seconds']:.0f} s; warnings: "
              f"{diag['warnings'] or 'none'}")
        copies = pd.concat([fitted.sample(fitted.rows, rng).to_pandas().assign(_copy=i)
                            for i in range(10)])
        combined = rubin.fit_formula(copies, FORMULA, "logit")
        real = relation.query("_s", domain.encode_sql("_s")).df().astype(int)
        truth = smf.logit(FORMULA, real).fit(disp=0)
        single = smf.logit(FORMULA, copies[copies["_copy"] == 0]).fit(disp=0)
        print("\ncoefficient   real     Rubin (10 copies) 95% CI       one copy as if real")
        for name in combined.index:
            row = combined.loc[name]
            low, high = single.conf_int().loc[name]
            print(f"{name:<12} {truth.params[name]:6.3f}   {row['estimate']:6.3f} "
                  f"[{row['ci_low']:6.3f}, {row['ci_high']:6.3f}]   "
                  f"{single.params[name]:6.3f} [{low:6.3f}, {high:6.3f}]")
        # One table to browse: rows spread over many posterior draws (at release time:
        # --option sampling=predictive). Not for Rubin's rules, which need whole copies.
        best = dataclasses.replace(fitted, sampling="predictive").sample(fitted.rows, rng)
        first = copies[copies["_copy"] == 0].drop(columns="_copy")
        print(f"\n2-way workload error vs the real rows: a released copy "
              f"{workload_error(real, first, list(domain.shape)):.4f}, a sampling=predictive "
              f"copy {workload_error(real, best.to_pandas(), list(domain.shape)):.4f}")
        store.close()


if __name__ == "__main__":
    main()
