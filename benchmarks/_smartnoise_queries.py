"""Run the overhead queries through smartnoise-sql's pandas reader (in its own venv).

Called by query_overhead.py as: python _smartnoise_queries.py DATA.csv RUNS QUERIES_JSON.
Prints JSON {query name: median seconds}. Loading the rows into the reader
(smartnoise copies them into SQLite) is setup and is not timed. With a fourth
argument ``answers`` (sql_breadth.py) it prints instead, per query, the first
value of RUNS answers, or ``{"refused": message}`` when smartnoise-sql rejects it.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import pandas as pd
import snsql
from snsql import Privacy

METADATA = {
    "Adult": {"": {"adult": {
        "row_privacy": True,
        "sex": {"type": "int", "lower": 0, "upper": 1},
        "race": {"type": "int", "lower": 0, "upper": 4},
        "age": {"type": "int", "lower": 0, "upper": 84},
        "capital_gain": {"type": "int", "lower": 0, "upper": 99},
    }}},
}


def main() -> None:
    data, runs, queries = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    df = pd.read_csv(data)
    reader = snsql.from_df(df, privacy=Privacy(epsilon=1.0, delta=1e-6), metadata=METADATA)
    if sys.argv[4:] == ["answers"]:
        print(json.dumps({name: answers(reader, sql, runs) for name, sql in queries.items()}))
        return
    out = {}
    for name, sql in queries.items():
        reader.execute(sql)  # warm
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            reader.execute(sql)
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    print(json.dumps(out))


def answers(reader: Any, sql: str, runs: int) -> list[float] | dict[str, str]:
    """The first value of ``runs`` answers to ``sql``, or why smartnoise-sql refused it."""
    try:
        return [float(reader.execute(sql)[1][0]) for _ in range(runs)]
    except Exception as err:  # smartnoise reports an unsupported query with many error types
        return {"refused": f"{type(err).__name__}: {' '.join(str(err).split())[:120]}"}


if __name__ == "__main__":
    main()
