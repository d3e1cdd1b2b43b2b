"""A DP query joined to a public lookup table, and the same table read for free.

    python examples/public_join.py

The policy declares a public table, education levels keyed by Adult's
``education_num`` code. Applying the policy copies it into the store and checks
that its key is unique, so each private row meets at most one public row and a
join costs what the query costs without it. The analyst groups by the public
column (every level gets a row, from the public table) and reads the table
itself free of charge.
"""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path

import yaml

import dpsql

DATA = Path(str(resources.files("dpsql").joinpath("data")))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = [f"{code},{'school' if code < 9 else 'college' if code < 13 else 'degree'}"
                for code in range(16)]
        (folder / "levels.csv").write_text("education_num,level\n" + "\n".join(rows) + "\n")
        policy = yaml.safe_load((DATA / "adult.yaml").read_text())
        policy["public_tables"] = {"levels": {"path": "levels.csv", "key": "education_num"}}
        (folder / "adult.yaml").write_text(yaml.safe_dump(policy))
        store, _ = dpsql.init(folder / "adult.duckdb", folder / "adult.yaml",
                              {"adult": DATA / "adult_sample.csv"})
        store.close()

        with dpsql.connect(folder / "adult.duckdb", "alice") as alice:
            answer = alice.sql(
                "SELECT l.level, COUNT(*) AS people, AVG(a.hours_per_week) AS hours "
                "FROM adult a JOIN levels l ON a.education_num = l.education_num "
                "GROUP BY l.level ORDER BY l.level")
            print(f"DP query ({answer.kind}, cost {answer.cost.describe()}):")
            print(answer.to_pandas().to_string(index=False))

            free = alice.sql("SELECT level, count(*) AS codes FROM public_tables.levels "
                             "GROUP BY 1 ORDER BY 1")
            print(f"\npublic table ({free.kind}, cost {free.cost.describe()}):")
            print(free.to_pandas().to_string(index=False))

            try:
                alice.sql("SELECT SUM(l.education_num) FROM adult a "
                          "JOIN levels l ON a.age = l.education_num")
            except dpsql.QueryRejected as err:
                print(f"\nrefused before any charge: {err}")


if __name__ == "__main__":
    main()
