"""Free queries over released tables, and why they cannot reach private data.

    python examples/free_queries.py

An administrator releases a DP synthetic table of the Adult sample. An analyst
then runs any read-only SQL on it for free: joins, window functions, the udfs
macros. Each free query runs on an isolated DuckDB database that holds copies
of the released tables and nothing else. The script shows what that database
holds, and how an attack from the first review is refused.
"""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path

import dpsql
from dpsql.query.free import FREE

DATA = Path(str(resources.files("dpsql").joinpath("data")))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "adult.duckdb"
        store, _ = dpsql.init(path, DATA / "adult.yaml", {"adult": DATA / "adult_sample.csv"})
        store.close()
        with dpsql.connect(path, "admin") as admin:
            admin.release("adult", synthesizer="independent", epsilon=1, seed=1,
                          columns=["age", "sex", "race", "income_50k"], name="adult_syn")

        with dpsql.connect(path, "alice") as alice:
            answer = alice.sql(
                "SELECT CAST(udfs.dp_bin(age, 10) AS INTEGER) AS age_code_bin, count(*) AS people, "
                "round(avg(income_50k), 3) AS share_over_50k, "
                "rank() OVER (ORDER BY count(*) DESC) AS rank "
                "FROM released.adult_syn GROUP BY 1 ORDER BY 1")
            print(f"free query ({answer.kind}, cost {answer.cost.describe()}):")
            print(answer.to_pandas().to_string(index=False))

            store = alice.store
            with store[FREE].using(store) as copy:  # run in a sandbox process
                held = copy.run("SELECT schema_name || '.' || table_name AS t "
                                "FROM duckdb_tables()", user="alice")
            print("\nthe isolated database holds:", ", ".join(held.column("t").to_pylist()))

            attack = ("SELECT * FROM released.adult_syn "
                      "CROSS JOIN LATERAL histogram(adult, age)")
            try:
                alice.sql(attack)
            except dpsql.QueryRejected as err:
                print(f"\n{attack}\n  -> refused: {err}")
            budget = alice.budget()[0]
            print(f"\nalice's budget: {budget.spent.describe()} spent (free queries cost nothing)")


if __name__ == "__main__":
    main()
