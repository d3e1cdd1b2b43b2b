"""Synthesize the Adult sample with SDS: DP aggregates, then aggregate-seeded records.

    python examples/sds_adult.py [--epsilon 1] [--rows 2000]

Builds a governed store from the bundled Adult sample, fits the ``sds``
synthesizer within a zCDP budget (the policy converts epsilon at its delta),
prints the budget split, a few released aggregates and synthetic rows, and how
far the synthetic 2-way marginals are from the real ones (an admin-side check
that reads the real data: it is not DP).
"""

from __future__ import annotations

import argparse
import tempfile
from importlib import resources
from itertools import combinations
from pathlib import Path

import numpy as np

import dpsql
from dpsql.domain import Domain
from dpsql.privacy import rho_from_epsilon_delta
from dpsql.source import bounded_relation
from dpsql.synth import get
from dpsql.synth.sds import _encoded

DATA = Path(str(resources.files("dpsql").joinpath("data")))
COLUMNS = ["age", "workclass", "education_num", "marital_status", "race", "sex",
           "hours_per_week", "income_50k"]


def workload_error(real: np.ndarray, synthetic: np.ndarray, sizes: list[int]) -> float:
    """Mean over 2-way marginals of half the L1 distance of the normalized tables."""
    errors = []
    for a, b in combinations(range(len(sizes)), 2):
        cells = sizes[a] * sizes[b]
        t = np.bincount(real[:, a] * sizes[b] + real[:, b], minlength=cells) / len(real)
        s = np.bincount(synthetic[:, a] * sizes[b] + synthetic[:, b], minlength=cells)
        errors.append(0.5 * np.abs(t - s / len(synthetic)).sum())
    return float(np.mean(errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--rows", type=int, default=None, help="default: the DP record count")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store, _ = dpsql.init(Path(tmp) / "adult.duckdb", DATA / "adult.yaml",
                              {"adult": DATA / "adult_sample.csv"})
        try:
            policy = store.active_policy()
            dataset = policy.dataset("adult")
            domain = Domain.from_dataset(dataset, COLUMNS)
            budget = rho_from_epsilon_delta(args.epsilon, policy.delta or 1e-6)
            synth = get("sds", reporting_length="3")
            fitted = synth.fit(bounded_relation(store, dataset), domain, budget,
                               np.random.default_rng(0))
            real = _encoded(bounded_relation(store, dataset), domain)
        finally:
            store.close()

    about = fitted.describe()
    print(f"budget {budget.describe(policy.delta)}; spent {fitted.spent.describe(policy.delta)}")
    print(f"DP record count {fitted.rows} (true {len(real)})")
    for step in about["measurements"][1:]:
        print(f"  length {step['length']}: {step['candidates']:>6} candidates, each record "
              f"keeps <= {step['allowed_sensitivity']:>3}, sigma {step['sigma']:7.1f}, "
              f"{step['reported']:>6} reported")
    aggregates = fitted.products()["aggregates"]
    print("\nsome released aggregates (released.<name>_aggregates):")
    for row in aggregates.slice(0, 3).to_pylist() + aggregates.slice(
            aggregates.num_rows - 3, 3).to_pylist():
        print(f"  {row['noisy_count']:>6}  {row['tuple']}")

    rows = args.rows or fitted.rows
    table = fitted.sample(rows, np.random.default_rng(1))
    print(f"\n{rows} synthetic rows, e.g.")
    print(domain.decode(table.slice(0, 5), np.random.default_rng(2)).to_pandas().to_string())
    print("synthesis:", fitted.diagnostics)
    synthetic = np.stack([table.column(c).to_numpy() for c in COLUMNS], axis=1)
    sizes = [a.size for a in domain.attributes]
    print(f"2-way workload error vs the real data: {workload_error(real, synthetic, sizes):.4f}"
          " (admin-side check, not DP)")


if __name__ == "__main__":
    main()
