"""Range-query accuracy of the `range` tree against a flat noisy histogram (same budget).

Answers every range [lo, hi) of one-year age bins (Adult: 85 bins; ACS agep: 100 bins)
from 200 fits each, under zCDP (delta 1e-6) and pure DP, and prints the root mean
squared error by range width (narrow: 1-5 bins, medium: 6-30, wide: > 30) for a
flat histogram (the book's synthetic representation, Programming DP ch. 14) and
trees of branching 2, 4 and 16 (dpsql.synth.range_tree; the default is marked),
with the median fit time.

    python benchmarks/range_queries.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, readme, shared_data

import dpsql
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.privacy import budget_cost
from dpsql.synth.measure import count_marginals
from dpsql.synth.range_tree import choose_branching, noisy_tree

SHARED = shared_data("adult").parent

POLICY = """version: 1
accounting: {accounting}
{delta}datasets:
  people:
    table: people
    budget: {{epsilon: .inf}}
    columns:
      {column}: {{type: integer, bounds: [0, {top}], bins: 1}}
    synthesizers: [range]
users:
  admin: {{role: admin, budgets: {{people: {{epsilon: .inf}}}}}}
"""

DATASETS = {
    "adult age": (SHARED / "adult" / "adult.csv", "age", 84, None),
    "acs agep": (SHARED / "acs" / "national2019.csv", "agep", 99, "N"),
}
WIDTHS = {"narrow (1-5)": (1, 5), "medium (6-30)": (6, 30), "wide (>30)": (31, 10**9)}


def exact_counts(directory: Path, label: str, accounting: str) -> np.ndarray:
    path, column, top, na = DATASETS[label]
    policy = directory / f"{column}-{accounting}.yaml"
    delta = "delta: 1.0e-6\n" if accounting == "zcdp" else ""
    policy.write_text(POLICY.format(accounting=accounting, delta=delta, column=column, top=top))
    store_path = directory / f"{column}-{accounting}.duckdb"
    store, _ = dpsql.init(store_path, policy, {"people": path}, na=na)
    store.close()
    with dpsql.connect(store_path, "admin") as admin:
        ds = admin.policy.dataset("people")
        domain = Domain.from_dataset(ds)
        return count_marginals(bounded_relation(admin.store, ds), domain, [(column,)])[0]


def range_errors(estimate: np.ndarray, exact: np.ndarray) -> dict[str, list[float]]:
    """Squared error of every range, grouped by width."""
    error = np.concatenate([[0.0], np.cumsum(estimate - exact)])
    n = exact.size
    lo, hi = np.triu_indices(n + 1, 1)
    squared = (error[hi] - error[lo]) ** 2
    width = hi - lo
    return {name: squared[(width >= a) & (width <= b)].tolist()
            for name, (a, b) in WIDTHS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=200)
    parser.add_argument("--epsilons", default="0.3,1,3")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dpsql-range-") as tmp:
        for label in DATASETS:
            for accounting in ("zcdp", "pure"):
                exact = exact_counts(Path(tmp), label, accounting)
                auto = choose_branching((exact.size,), accounting)
                for epsilon in (float(e) for e in args.epsilons.split(",")):
                    cost = budget_cost(accounting, epsilon=epsilon,
                                       delta=1e-6 if accounting == "zcdp" else None)
                    for branching in (0, 2, 4, 16):
                        method = "flat" if branching == 0 else f"tree b={branching}"
                        method += " (default)" if branching == auto else ""
                        squared: dict[str, list[float]] = {k: [] for k in WIDTHS}
                        times = []
                        for _ in range(args.fits):
                            start = time.perf_counter()
                            leaves, _, _ = noisy_tree(exact, branching, cost, 1)
                            times.append(time.perf_counter() - start)
                            for key, values in range_errors(leaves, exact).items():
                                squared[key] += values
                        row: dict[str, Any] = {"data": label, "accounting": accounting,
                                               "epsilon": f"{epsilon:g}", "method": method}
                        for key, values in squared.items():
                            row[f"rmse {key}"] = float(np.sqrt(np.mean(values)))
                        row["fit_ms"] = 1000 * statistics.median(times)
                        rows.append(row)
    print_table(rows, args.json)
    if not args.json:
        print(f"\n{args.fits} fits each; RMSE over every range of the given width (counts).")
        readme_lines(rows, args.fits)


def readme_lines(rows: list[dict[str, Any]], fits: int) -> None:
    """The README's figure: wide-range RMSE of the default method against flat, at eps 1."""
    wide = "rmse " + next(k for k in WIDTHS if k.startswith("wide"))
    for row in rows:
        if row["epsilon"] == "1" and row["method"].endswith("(default)"):
            flat = next(r for r in rows if r["method"].startswith("flat") and
                        all(r[k] == row[k] for k in ("data", "accounting", "epsilon")))
            readme(f"{row['data']} {row['accounting']} eps 1, {fits} fits: wide-range RMSE "
                   f"{row[wide]:.0f} ({row['method']}) vs {flat[wide]:.0f} (flat)")


if __name__ == "__main__":
    main()
