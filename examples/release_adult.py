"""Release DP synthetic tables of the Adult sample, read them, export and evaluate them.

    python examples/release_adult.py

Steps: an administrator releases an `independent` table (5 copies), a `joint`
table and a `range` tree of ages; adds copies to the joint table at no cost;
an analyst reads the released tables with plain SQL and answers range queries
from the tree for free; the admin exports a Parquet file carrying the
provenance and scores the releases against the real data (not DP).
"""

from __future__ import annotations

import json
import tempfile
from importlib import resources
from pathlib import Path

import pyarrow.parquet as pq

import dpsql
from dpsql.analysis.fidelity import evaluate_release
from dpsql.provenance import export

DATA = Path(str(resources.files("dpsql").joinpath("data")))
COLUMNS = ["age", "sex", "race", "income_50k"]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "adult.duckdb"
        store, _ = dpsql.init(path, DATA / "adult.yaml", {"adult": DATA / "adult_sample.csv"})
        store.close()

        with dpsql.connect(path, "admin") as admin:
            independent = admin.release("adult", synthesizer="independent", epsilon=1,
                                        name="adult_independent", copies=5, seed=1)
            joint = admin.release("adult", synthesizer="joint", epsilon=1, columns=COLUMNS,
                                  name="adult_joint", seed=2)
            admin.release("adult", synthesizer="range", epsilon=0.5, columns=["age"],
                          name="age_ranges")
            for release in (independent, joint):
                record = release.record
                charged = record["cost"]["charged"]
                print(f"{release.table}: {record['rows']} rows x {record['copies']} copies, "
                      f"{record['privacy']}, charged epsilon={charged['epsilon']:.3g} at "
                      f"delta={charged['delta']:g} (rho={float(charged['rho']):.4g})")
            more = admin.release_more("adult_joint", 2, seed=3)  # from the stored DP state
            print(f"{more.table}: now {more.record['copies']} copies, no budget spent")
            print("admin's budget left:", admin.budget()[0].remaining.describe(
                admin.policy.delta, rounding="down"))

        with dpsql.connect(path, "alice") as alice:  # analysts read released.* for free
            cur = alice.store.cursor()
            rows = cur.execute(
                "SELECT _copy, avg(income_50k) FROM released.adult_joint GROUP BY 1 ORDER BY 1"
            ).fetchall()
            print("share with income >50K per synthetic copy:",
                  [round(share, 3) for _, share in rows])
            ages = cur.execute("SELECT udfs.dp_range_count('age_ranges', 20, 40)").fetchall()
            print(f"people with age code in [20, 40) from the DP range tree: {ages[0][0]:.0f}")
            exported = export(alice.store, "adult_joint", Path(tmp) / "adult_joint.parquet")
            metadata = pq.read_schema(exported["path"]).metadata
            record = json.loads(metadata[b"dpsql.provenance"])
            print(f"exported {exported['rows']} rows; provenance in the file names release "
                  f"{record['release_id']} by {record['synthesizer']['name']}")

        with dpsql.connect(path, "admin") as admin:  # not DP: the admin's eyes only
            for name in ("adult_independent", "adult_joint"):
                evaluation = evaluate_release(admin, name, seed=0)
                mine, ideal = evaluation.synthetic.summary(), evaluation.ideal.summary()
                print(f"{name}: median d {mine['median_d']:.3f} (ideal {ideal['median_d']:.3f}),"
                      f" workload error {mine['workload_error']:.3f} "
                      f"(ideal {ideal['workload_error']:.3f})")


if __name__ == "__main__":
    main()
