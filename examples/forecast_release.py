"""Forecast a release before paying for it: the noise each measurement will carry.

    PYTHONPATH=. python examples/forecast_release.py

Builds a zCDP store over the bundled 5,000-row Adult sample whose policy
declares the row count public, then asks for dry runs (``dpsql release
--dry-run``; here the admin operation ``release.plan``): ``independent``, the
yardstick, and MODP in DP mode at epsilon 1, whose forecast says it cannot beat
``independent`` (its seeds get a tenth of the budget and each DP-SGD step is
mostly noise). The real MODP release is refused before the charge; the budget is
untouched; ``independent`` then releases. A few seconds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import dpsql
from dpsql.admin.releases import plan_release
from dpsql.errors import ReleaseError

SAMPLE = Path(__file__).resolve().parents[1] / "dpsql" / "data" / "adult_sample.csv"
POLICY = """version: 1
accounting: zcdp
delta: 1.0e-6
datasets:
  adult:
    table: adult
    public_row_count: 5000
    budget: {epsilon: 10}
    synthesizers: [independent, modp]
    columns:
      age: {type: integer, bounds: [0, 84], bins: 10}
      education_num: {type: integer, bounds: [0, 15], bins: 1}
      occupation: {type: categorical, values: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]}
      relationship: {type: categorical, values: [0, 1, 2, 3, 4, 5]}
      sex: {type: categorical, values: [0, 1]}
      hours_per_week: {type: integer, bounds: [0, 98], bins: 10}
      income_50k: {type: categorical, values: [0, 1]}
users:
  admin: {role: admin, budgets: {adult: {epsilon: 10}}}
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "adult.yaml"
        policy.write_text(POLICY)
        path = Path(tmp) / "adult.duckdb"
        dpsql.init(path, policy, {"adult": SAMPLE})[0].close()
        with dpsql.connect(path, "admin") as admin:
            before = admin.ledger.budget("admin", "adult").remaining
            for synthesizer, options in (("independent", {}), ("modp", {"mode": "dp"})):
                plan = plan_release(admin, dataset="adult", synthesizer=synthesizer,
                                    name=f"adult_{synthesizer}", epsilon=1, options=options)
                print(f"{synthesizer}: would charge {plan.cost}")
                for line in plan.forecast.lines():
                    print(f"  {line}")
                print(f"  -> {plan.refused or 'would run'}")
            try:
                admin.release("adult", synthesizer="modp", name="adult_modp", epsilon=1,
                              mode="dp")
            except ReleaseError as err:
                print(f"modp refused before the charge: {str(err)[:80]}...")
            else:
                raise SystemExit("the forecast did not refuse a hopeless release")
            assert admin.ledger.budget("admin", "adult").remaining == before
            result = admin.release("adult", synthesizer="independent", name="adult_ind",
                                   epsilon=1, seed=1)
            print(f"released {result.table}; its provenance keeps the forecast: "
                  f"{len(result.record['forecast']['planned'])} planned measurement kind(s)")


if __name__ == "__main__":
    main()
