"""Administer a governed store: create it, apply a policy change, grant budget, audit.

    python examples/admin_tour.py
"""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path

import dpsql
from dpsql.errors import BudgetExceeded

DATA = Path(str(resources.files("dpsql").joinpath("data")))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "adult.duckdb"
        store, notes = dpsql.init(path, DATA / "adult.yaml", {"adult": DATA / "adult_sample.csv"})
        store.close()
        print("created", path.name, *notes)

        with dpsql.connect(path, "admin") as admin:
            stricter = Path(tmp) / "stricter.yaml"
            stricter.write_text((DATA / "adult.yaml").read_text()
                                .replace("query_cap: {epsilon: 1}", "query_cap: {epsilon: 0.5}"))
            print("policy changes:", admin.apply_policy(stricter))

        with dpsql.connect(path, "bob") as bob:
            ledger = bob.ledger
            cost = bob.cost(epsilon="0.5")
            try:
                while True:
                    charge = ledger.charge("bob", "adult", cost, "example charge")
                    left = charge.remaining.describe(bob.policy.delta, rounding="down")
                    print("charged; left:", left)
            except BudgetExceeded as err:
                print("refused:", err)

        with dpsql.connect(path, "admin") as admin:
            standing = admin.grant("bob", "adult", epsilon=1)
            left = standing.remaining.describe(admin.policy.delta, rounding="down")
            print("after grant bob has", left)
            for entry in admin.audit(last=4):
                print(entry["id"], entry["user"], entry["action"], entry["outcome"])


if __name__ == "__main__":
    main()
