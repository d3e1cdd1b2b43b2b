"""Ask DP questions of the Adult sample in SQL, end to end.

Builds a governed store in a temporary directory from the bundled Adult sample
and its policy (zCDP, epsilon 2 for alice, 0.1 per query by default, at most 1),
then asks a few aggregate questions as the analyst alice and prints each answer
with its cost, its noise and the budget left.

    python examples/query_adult.py
"""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import dpsql

DATA = Path(str(resources.files("dpsql").joinpath("data")))


def show(title: str, answer: Any) -> None:
    print(f"\n== {title}")
    print(answer.to_pandas().to_string(index=False))
    print(answer.notice or answer.status)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="dpsql-example-") as tmp:
        path = Path(tmp) / "adult.duckdb"
        # enforce_bounds: the policy's numeric bounds become CHECK constraints of the
        # table (every value must fit), so DP sums need not clamp row by row.
        store, _ = dpsql.init(path, DATA / "adult.yaml", {"adult": DATA / "adult_sample.csv"},
                              enforce_bounds=True)
        store.close()

        with dpsql.connect(path, "alice") as alice:
            # What may be asked: columns, their public domains, how to group by them.
            show("the public schema", alice.sql("SHOW dpsql.datasets"))

            # Before spending anything: what would this cost, and how noisy would it be?
            sql = ("SELECT income_50k, COUNT(*) AS people, AVG(hours_per_week) AS hours "
                   "FROM adult WHERE age BETWEEN 10 AND 40 GROUP BY income_50k")
            show("EXPLAIN PRIVACY (free)", alice.sql("EXPLAIN PRIVACY " + sql))

            # Ask it, with 95% intervals for every aggregate.
            alice.sql("SET dpsql.ci = 0.95")
            answer = alice.sql(sql)
            show("a range query with a marginal", answer)
            print("hours column:", answer.columns["hours"]["note"])

            # A binned marginal at a higher epsilon, GoogleSQL style.
            show("a binned marginal at epsilon 0.5", alice.sql(
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5) "
                "dp_bin(age, 20) AS age_from, sex, COUNT(*) AS n FROM adult "
                "GROUP BY 1, 2 ORDER BY 1, 2"))

            # Asking again returns the same numbers at no cost: averaging repeats gains nothing.
            again = alice.sql(sql)
            assert again.cached
            assert again.cost.is_zero
            assert again.table.equals(answer.table)
            show("the same query again (cached)", again)

            # Refused constructs say why and what to write instead; nothing is charged.
            try:
                alice.sql("SELECT age, MAX(capital_gain) FROM adult GROUP BY age")
            except dpsql.QueryRejected as err:
                print("\n== refused:", err)

            show("alice's budget", alice.sql("SHOW dpsql.budget"))


if __name__ == "__main__":
    main()
