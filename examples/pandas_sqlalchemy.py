"""pandas through SQLAlchemy: reflect a dpsql server, read DP answers and released tables.

    python examples/pandas_sqlalchemy.py

Builds a store from the bundled Adult sample, releases a synthetic table, gives
the analyst alice a password and starts `dpsql serve` on a free port. Then, as
an analyst's notebook would, with SQLAlchemy's `postgresql+psycopg` dialect:
lists the datasets and released tables with their columns and descriptions,
reads a DP aggregate into a DataFrame (charged once), reads the released table
whole and in chunks (free), and copies a DP answer out as CSV. The server is
stopped at the end.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import pandas as pd
import psycopg
import sqlalchemy as sa
from psycopg_client import DATA, PASSWORD, serving  # the example next to this one

import dpsql
from dpsql import passwords


def prepare(db: Path) -> None:
    """A store with the Adult sample, one released synthetic table and alice's password."""
    store, _ = dpsql.init(db, DATA / "adult.yaml", {"adult": DATA / "adult_sample.csv"})
    passwords.set_password(store, "alice", PASSWORD)  # what `dpsql user add alice` does
    store.close()
    with dpsql.connect(db, "admin") as admin:
        admin.release("adult", synthesizer="independent", name="adult_syn", epsilon=1,
                      rows=1000, columns=["age", "sex", "race", "income_50k"], seed=1)


def explore(port: int) -> None:
    url = sa.URL.create("postgresql+psycopg", username="alice", password=PASSWORD,
                        host="127.0.0.1", port=port, database="adult")
    engine = sa.create_engine(url)
    inspector = sa.inspect(engine)
    print("1. What the server offers (schema only, never data):")
    for schema in ("public", "released"):
        for table in inspector.get_table_names(schema=schema):
            print(f"   {schema}.{table}")
            for column in inspector.get_columns(table, schema=schema)[:3]:
                print(f"      {column['name']:<14} {column['type']!s:<8} "
                      f"{column['comment'] or ''}")

    print("2. A DP aggregate as a DataFrame (charged once):")
    counts = pd.read_sql(sa.text("SELECT income_50k, COUNT(*) AS n FROM adult "
                                 "GROUP BY income_50k ORDER BY income_50k"), engine)
    print(counts.to_string(index=False))

    print("3. The released table, whole and in chunks (free):")
    synthetic = pd.read_sql("SELECT * FROM released.adult_syn", engine)
    print(f"   {len(synthetic)} rows; mean age code {synthetic['age'].mean():.1f}")
    with engine.connect() as conn:
        chunks = pd.read_sql(sa.text("SELECT * FROM released.adult_syn"),
                             conn.execution_options(stream_results=True), chunksize=400)
        print("   chunk sizes:", [len(chunk) for chunk in chunks])

    print("4. COPY a DP answer out as CSV (psql: \\copy (SELECT ...) TO 'file' CSV HEADER):")
    with psycopg.connect(host="127.0.0.1", port=port, user="alice", password=PASSWORD,
                         dbname="adult", autocommit=True) as conn:
        with conn.cursor().copy("COPY (SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex "
                                "ORDER BY sex) TO STDOUT WITH CSV HEADER") as copy:
            text = b"".join(bytes(block) for block in copy).decode()
        print(pd.read_csv(io.StringIO(text)).to_string(index=False))
    print("5. The budget: two DP queries charged, free reads not:")
    print(pd.read_sql("SHOW dpsql.budget", engine).to_string(index=False))
    engine.dispose()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "adult.duckdb"
        prepare(db)
        with serving(db) as port:
            explore(port)


if __name__ == "__main__":
    main()
