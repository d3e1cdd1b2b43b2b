"""A dataset whose rows stay in Spark: DP queries and a synthetic release run on it.

The store (a DuckDB file) keeps the policy, the ledger, the audit log and the
released table; the sensitive rows stay in a Parquet file that Spark reads
(``local[2]`` here; a policy's ``master:`` points at a cluster). The example
writes 200,000 generated rows to Parquet, answers a DP query on Spark and
releases an ``independent`` synthetic table whose bounded source Spark streams
to dpsql in Arrow batches. Needs ``pip install 'dpsql[spark]'`` and Java 17.

    python examples/spark_engine.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import duckdb
import yaml

import dpsql

ROWS = 200_000


def generate(path: Path) -> None:
    """``ROWS`` made-up people (a fixed hash of the row number) as Parquet."""
    duckdb.sql(f"""COPY (SELECT i // 2 AS person, 17 + hash(i) % 74 AS age,
        CASE WHEN hash(i + 1) % 2 = 0 THEN 'F' ELSE 'M' END AS sex,
        1 + hash(i + 2) % 99 AS hours FROM range({ROWS}) r(i)) TO '{path}' (FORMAT parquet)""")


def policy(path: Path) -> str:
    """Dataset ``people`` on Spark: a person may have two rows, one is kept."""
    people = {
        "table": "people", "privacy_unit": "person", "max_rows": 1,
        "engine": {"kind": "spark", "path": str(path), "master": "local[2]"},
        "budget": {"epsilon": 5}, "default_query": {"epsilon": 0.5},
        "synthesizers": ["independent"],
        "columns": {"person": {"type": "hidden"},
                    "age": {"type": "integer", "bounds": [17, 90]},
                    "sex": {"type": "categorical", "values": ["F", "M"]},
                    "hours": {"type": "integer", "bounds": [1, 99]}},
    }
    users = {"admin": {"role": "admin", "budgets": {"people": {"epsilon": 5}}}}
    return yaml.safe_dump({"version": 1, "accounting": "pure",
                           "datasets": {"people": people}, "users": users})


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data, store = Path(tmp) / "people.parquet", Path(tmp) / "store.duckdb"
        generate(data)
        (Path(tmp) / "policy.yaml").write_text(policy(data))
        dpsql.init(store, Path(tmp) / "policy.yaml")[0].close()  # imports nothing
        with dpsql.connect(store, "admin") as admin:
            answer = admin.sql("SELECT sex, COUNT(*), AVG(hours) FROM people GROUP BY sex")
            print(answer.notice)
            print(answer.table.to_pandas().to_string(index=False))
            release = admin.release("people", synthesizer="independent", name="people_synth",
                                    epsilon=1, rows=1000)
            print(f"released {release.table} ({release.record['rows']} rows); its source was "
                  "streamed from Spark in Arrow batches")
            print(admin.sql("SELECT sex, COUNT(*) AS n FROM released.people_synth GROUP BY sex "
                            "ORDER BY sex").table.to_pandas().to_string(index=False))


if __name__ == "__main__":
    main()
