"""A release whose fit fails its diagnostics is held from analysts until an admin publishes it.

    PYTHONPATH=. python examples/held_release.py

Builds a zCDP store over the bundled 5,000-row Adult sample, then asks NAPSU-MQ
for a Laplace fit of a sparse 3-way marginal (125 cells) at epsilon 0.05: its
Gaussian approximation fits the posterior so poorly that one importance draw
takes all the weight. The release is charged and recorded, but written to
``held.sparse``, which no analyst can read; the administrator reads the failed
checks, then publishes the table explicitly (or would release again). About a
minute on two cores.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import dpsql
from dpsql.errors import QueryRejected

SAMPLE = Path(__file__).resolve().parents[1] / "dpsql" / "data" / "adult_sample.csv"
POLICY = """version: 1
accounting: zcdp
delta: 1.0e-6
datasets:
  adult:
    table: adult
    budget: {epsilon: 10}
    synthesizers: [napsu_mq]
    columns:
      age: {type: integer, bounds: [0, 84], bins: [0, 17, 34, 51, 68, 84]}
      sex: {type: categorical, values: [0, 1]}
      race: {type: categorical, values: [0, 1, 2, 3, 4]}
      hours_per_week: {type: integer, bounds: [0, 98], bins: [0, 20, 40, 60, 80, 98]}
      income_50k: {type: categorical, values: [0, 1]}
      fnlwgt: {type: hidden}
users:
  admin: {role: admin, budgets: {adult: {epsilon: 10}}}
  alice: {role: analyst, budgets: {adult: {epsilon: 1}}}
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "adult.yaml"
        policy.write_text(POLICY)
        path = Path(tmp) / "adult.duckdb"
        dpsql.init(path, policy, {"adult": SAMPLE})[0].close()
        with dpsql.connect(path, "admin") as admin, dpsql.connect(path, "alice") as alice:
            result = admin.release("adult", synthesizer="napsu_mq", name="sparse", epsilon=0.05,
                                   seed=1, inference="laplace",
                                   cliques="age+race+hours_per_week")
            print(f"written to {result.table}; {result.held}")
            for check in result.record["diagnostics"]["checks"]:
                print(f"  {'pass' if check['passed'] else 'FAIL'}  {check['check']}: "
                      f"{check['value']} (limit {check['limit']})")
            assert not result.record["published"]
            try:
                alice.sql("SELECT count(*) FROM released.sparse")
            except QueryRejected as err:
                print(f"alice cannot read it: {err}")
            else:
                raise SystemExit("an analyst read a held release")
            print("audit:", admin.audit("admin", last=1)[0]["outcome"])

            published = admin.publish("sparse")  # the administrator's explicit decision
            rows = alice.sql("SELECT count(*) AS n FROM released.sparse").table
            print(f"published as {published.table} by {published.record['published_by']}; "
                  f"alice now reads {rows.column('n')[0].as_py():,} rows")


if __name__ == "__main__":
    main()
