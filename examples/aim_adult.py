"""Release the Adult sample with AIM and MST: marginals chosen under the budget, then a model.

    python examples/aim_adult.py [--epsilon 1]

Needs the synth extra (``pip install 'dpsql[synth]'``). An administrator allows
``aim`` and ``mst`` in the demo policy and releases both at the same budget;
the provenance shows which marginals each chose, with what noise, and that the
whole charge was spent; the admin then scores both against the real data (not DP).
"""

from __future__ import annotations

import argparse
import tempfile
from importlib import resources
from pathlib import Path

import dpsql
from dpsql.analysis.fidelity import evaluate_release

DATA = Path(str(resources.files("dpsql").joinpath("data")))
COLUMNS = ["age", "education_num", "marital_status", "race", "sex", "hours_per_week",
           "income_50k"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "adult.yaml"
        policy.write_text((DATA / "adult.yaml").read_text().replace(
            "synthesizers: [independent,", "synthesizers: [aim, mst, independent,"))
        path = Path(tmp) / "adult.duckdb"
        dpsql.init(path, policy, {"adult": DATA / "adult_sample.csv"})[0].close()

        with dpsql.connect(path, "admin") as admin:
            for name in ("mst", "aim"):
                release = admin.release("adult", synthesizer=name, epsilon=args.epsilon,
                                        name=f"adult_{name}", columns=COLUMNS, seed=1)
                record = release.record
                cost = record["cost"]
                print(f"{release.table}: {record['rows']} rows; charged rho="
                      f"{float(cost['charged']['rho']):.6g}, spent rho="
                      f"{float(cost['spent']['rho']):.6g}")
                diagnostics = record["diagnostics"]
                for step in diagnostics.get("rounds", diagnostics.get("tree", [])):
                    chosen = step.get("clique", step.get("pair"))
                    noise = f", then measured with sigma {step['sigma']:.1f}" \
                        if "sigma" in step else ""
                    where = f"round {step['round']:>2}: " if "round" in step else ""
                    print(f"  {where}chose {'+'.join(chosen):<32} among {step['candidates']:>2} "
                          f"candidates (exponential mechanism, epsilon "
                          f"{step['epsilon']:.3f}){noise}")

            for name in ("mst", "aim"):  # not DP: the admin's eyes only
                evaluation = evaluate_release(admin, f"adult_{name}", seed=0)
                mine, ideal = evaluation.synthetic.summary(), evaluation.ideal.summary()
                print(f"adult_{name} vs the real data (not DP): 2-way workload error "
                      f"{mine['workload_error']:.4f} (bootstrap ideal "
                      f"{ideal['workload_error']:.4f})")


if __name__ == "__main__":
    main()
