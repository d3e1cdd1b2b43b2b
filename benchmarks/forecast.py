"""Does the forecast tell the truth? DP-MODP against independent, where it says so and not.

For each (rows, epsilon), the policy declares the row count public, so MODP's
forecast can weigh DP-SGD's noise (its step-noise ratio, and whether it says
"cannot beat independent"). Then both are released (MODP forced past its
forecast) and scored by the 2-way workload error against the real rows
(``dpsql.analysis.fidelity``; lower is better), median over seeds. The
forecast itself is timed too: it runs before every release.

    python benchmarks/forecast.py                      # bundled Adult sample, 7 columns
    python benchmarks/forecast.py --rows 1000,5000 --epsilons 1,4 --seeds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _common import peak_rss_mb, print_table, readme

import dpsql
from dpsql.admin.releases import plan_release
from dpsql.analysis.fidelity import evaluate_release

SAMPLE = Path(__file__).resolve().parents[1] / "dpsql" / "data" / "adult_sample.csv"
COLUMNS = """\
      age: {type: integer, bounds: [0, 84], bins: 10}
      education_num: {type: integer, bounds: [0, 15], bins: 1}
      occupation: {type: categorical, values: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]}
      relationship: {type: categorical, values: [0, 1, 2, 3, 4, 5]}
      sex: {type: categorical, values: [0, 1]}
      hours_per_week: {type: integer, bounds: [0, 98], bins: 10}
      income_50k: {type: categorical, values: [0, 1]}
"""


def store(directory: Path, rows: int) -> Path:
    """The first ``rows`` rows of the Adult sample, their count declared public."""
    import duckdb

    part = directory / f"adult{rows}.parquet"
    duckdb.connect().execute(f"COPY (SELECT * FROM read_csv_auto('{SAMPLE}') LIMIT {rows}) "
                             f"TO '{part}'")
    policy = directory / f"adult{rows}.yaml"
    policy.write_text(
        "version: 1\naccounting: zcdp\ndelta: 1.0e-6\ndatasets:\n  adult:\n"
        f"    table: adult\n    public_row_count: {rows}\n    budget: {{epsilon: .inf}}\n"
        f"    synthesizers: [independent, modp]\n    columns:\n{COLUMNS}"
        "users:\n  admin: {role: admin, budgets: {adult: {epsilon: .inf}}}\n")
    path = directory / f"adult{rows}.duckdb"
    dpsql.init(path, policy, {"adult": part})[0].close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="5000", help="comma-separated row counts")
    parser.add_argument("--epsilons", default="1,4")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        for rows in (int(r) for r in args.rows.split(",")):
            path = store(Path(tmp), rows)
            with dpsql.connect(path, "admin") as admin:
                for epsilon in (float(e) for e in args.epsilons.split(",")):
                    start = time.perf_counter()
                    plan = plan_release(admin, dataset="adult", synthesizer="modp", name="m",
                                        epsilon=epsilon, options={"mode": "dp"})
                    forecast_ms = (time.perf_counter() - start) * 1000
                    step = next(line for line in plan.forecast.lines()
                                if line.startswith("each DP-SGD step"))
                    ratio = float(step.split("noise is ")[1].split("x")[0])
                    errors: dict[str, list[float]] = {"independent": [], "modp": []}
                    for seed in range(args.seeds):
                        for name, options in (("independent", {}), ("modp", {"mode": "dp"})):
                            table_name = f"{name}_{rows}_{int(epsilon * 100)}_{seed}"
                            admin.release("adult", synthesizer=name, name=table_name,
                                          epsilon=epsilon, seed=seed, force=True,
                                          options=options)
                            scored = evaluate_release(admin.context(), table_name, seed=seed)
                            errors[name].append(scored.synthetic.workload_error)
                    independent = statistics.median(errors["independent"])
                    modp = statistics.median(errors["modp"])
                    table.append({"rows": rows, "epsilon": epsilon, "step_noise": ratio,
                                  "forecast": "cannot beat" if plan.forecast.worse else "-",
                                  "independent": independent, "modp": modp,
                                  "modp/ind": modp / independent,
                                  "forecast_ms": forecast_ms})
    print_table(table, args.json)
    print(f"peak memory {peak_rss_mb():,.0f} MB")
    right = sum((r["forecast"] != "-") == (r["modp/ind"] > 1) for r in table)
    readme(f"MODP forecast right in {right} of {len(table)} settings ("
           + "; ".join(f"{r['rows']:,} rows eps {r['epsilon']:g}: step noise "
                       f"{r['step_noise']:.2g}, {r['forecast']}, modp/independent "
                       f"{r['modp/ind']:.3f}" for r in table)
           + f"); forecast {min(r['forecast_ms'] for r in table):.0f}-"
           f"{max(r['forecast_ms'] for r in table):.0f} ms")


if __name__ == "__main__":
    main()
