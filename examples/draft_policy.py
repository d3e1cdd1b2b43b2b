"""Onboard a data set: draft a policy from the data, decide, import with domain checks.

    python examples/draft_policy.py

The draft is read from the private rows (not DP): an administrator reviews it
and keeps only what may be public before applying it.
"""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path

import dpsql
from dpsql.draft import draft_file
from dpsql.outside import DomainError

SAMPLE = Path(str(resources.files("dpsql").joinpath("data/adult_sample.csv")))


def main() -> None:
    text = draft_file(SAMPLE, dataset="adult")
    print(*[line for line in text.splitlines() if "age:" in line or "race:" in line], sep="\n")

    with tempfile.TemporaryDirectory() as tmp:
        # The administrator's decision: ages are public as [0, 100]; race keeps codes 0-2 only.
        decided = Path(tmp) / "adult.yaml"
        decided.write_text(text.replace("bounds: [0, 75]", "bounds: [0, 100]")
                           .replace("values: [0, 1, 2, 3, 4]}", "values: [0, 1, 2]}"))
        path = Path(tmp) / "adult.duckdb"
        try:
            dpsql.init(path, decided, {"adult": SAMPLE})
        except DomainError as err:
            print("refused:", *(o.describe(examples=False) for o in err.found))
        store, notes = dpsql.init(path, decided, {"adult": SAMPLE}, outside="drop")
        store.close()
        print(*notes, sep="\n")
        with dpsql.connect(path, "admin") as admin:
            answer = admin.sql("SELECT race, COUNT(*) FROM adult GROUP BY race")
            print(answer.table.to_pylist())


if __name__ == "__main__":
    main()
