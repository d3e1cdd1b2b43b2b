"""Release the Adult sample with SDS: DP aggregates, then aggregate-seeded records.

    python examples/sds_adult.py [--epsilon 1]

An administrator releases ``released.adult_sds`` with the ``sds`` synthesizer
(its DP aggregates come along as ``released.adult_sds_aggregates``); the
provenance shows how the budget was split; an analyst reads both tables with
plain SQL, free of charge; two more copies are sampled from the stored
aggregates at no cost; the admin scores the release against the real data
(not DP).
"""

from __future__ import annotations

import argparse
import tempfile
from importlib import resources
from pathlib import Path

import dpsql
from dpsql.analysis.fidelity import evaluate_release

DATA = Path(str(resources.files("dpsql").joinpath("data")))
COLUMNS = ["age", "workclass", "education_num", "marital_status", "race", "sex",
           "hours_per_week", "income_50k"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "adult.duckdb"
        store, _ = dpsql.init(path, DATA / "adult.yaml", {"adult": DATA / "adult_sample.csv"})
        store.close()

        with dpsql.connect(path, "admin") as admin:
            release = admin.release("adult", synthesizer="sds", epsilon=args.epsilon,
                                    name="adult_sds", columns=COLUMNS, seed=1,
                                    reporting_length=3)
            record = release.record
            spent = record["cost"]["spent"]
            print(f"{release.table}: {record['rows']} rows; spent rho={float(spent['rho']):.4g}"
                  f" (epsilon={spent['epsilon']:.3g} at delta={spent['delta']:g})")
            print("products:", ", ".join(record["products"]))
            count, *lengths = record["measurements"]
            print(f"  record count: sigma {count['sigma']:.1f}")
            for step in lengths:
                print(f"  length {step['length']}: {step['candidates']:>6} candidates, each "
                      f"record keeps <= {step['allowed_sensitivity']:>3}, sigma "
                      f"{step['sigma']:6.1f}, {step['reported']:>6} reported"
                      + (f", {step['uncovered']} pruned" if "uncovered" in step else ""))
            filled = record["diagnostics"]["synthesis"]["cells_filled"]
            print("  cells filled per pass:", ", ".join(f"{k} {v}" for k, v in filled.items()))
            more = admin.release_more("adult_sds", 2, seed=2)
            print(f"{more.table}: now {more.record['copies']} copies, no budget spent")

        with dpsql.connect(path, "alice") as alice:  # analysts read released.* for free
            cur = alice.store.cursor()
            print("\nthe largest released 3-way combinations:")
            for combo, count_ in cur.execute(
                    "SELECT tuple, noisy_count FROM released.adult_sds_aggregates "
                    "WHERE length = 3 ORDER BY noisy_count DESC LIMIT 3").fetchall():
                print(f"  {count_:>6}  {combo}")
            shares = cur.execute(
                "SELECT _copy, avg(income_50k) FROM released.adult_sds GROUP BY 1 ORDER BY 1"
            ).fetchall()
            print("share with income >50K per synthetic copy:",
                  [round(share, 3) for _, share in shares])

        with dpsql.connect(path, "admin") as admin:  # not DP: the admin's eyes only
            evaluation = evaluate_release(admin, "adult_sds", seed=0)
            mine, ideal = evaluation.synthetic.summary(), evaluation.ideal.summary()
            print(f"\nadult_sds vs the real data (not DP): median log discrepancy "
                  f"{mine['median_d']:.3f} (bootstrap ideal {ideal['median_d']:.3f}), "
                  f"workload error {mine['workload_error']:.4f} "
                  f"(ideal {ideal['workload_error']:.4f})")


if __name__ == "__main__":
    main()
