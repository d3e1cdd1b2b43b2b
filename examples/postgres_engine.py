"""A dataset whose rows stay in PostgreSQL: DP queries and a synthetic release run on it.

The store (a DuckDB file) keeps the policy, the ledger, the audit log and the
released table; the sensitive rows stay in a PostgreSQL table that dpsql reads
through a read-only role. The connection string comes from the environment
(``DPSQL_EXAMPLE_PG_DSN``, e.g. ``host=db.example port=5432 dbname=hr user=reader
password=...``, whose table ``public.adult`` holds the Adult sample's columns).
Without it, the example starts a throwaway local cluster (the Debian
``postgresql`` package) and copies the Adult sample there itself.

    python examples/postgres_engine.py
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import duckdb
import yaml

import dpsql

DSN_ENV = "DPSQL_EXAMPLE_PG_DSN"
DATA = Path(str(resources.files("dpsql").joinpath("data")))


@contextlib.contextmanager
def postgres() -> Iterator[None]:
    """Use the server named in DSN_ENV, or start a throwaway one holding the Adult sample."""
    if DSN_ENV in os.environ:
        yield
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import pgcluster  # the test suite's throwaway cluster (initdb on a free port)

    with pgcluster.cluster() as cluster:
        sample = duckdb.connect()
        sample.execute(f"CREATE TABLE adult AS SELECT * FROM '{DATA / 'adult_sample.csv'}'")
        pgcluster.copy_table(cluster, sample, "adult", "public.adult")
        os.environ[DSN_ENV] = cluster.dsn(password=pgcluster.READER_PASSWORD)
        yield


def policy_on_postgres() -> str:
    """The Adult sample's policy, with its rows on the engine."""
    raw = yaml.safe_load((DATA / "adult.yaml").read_text())
    raw["datasets"]["adult"]["engine"] = {"kind": "postgres", "dsn_env": DSN_ENV,
                                          "table": "public.adult"}
    raw["datasets"]["adult"]["synthesizers"] = ["independent"]
    return yaml.safe_dump(raw, sort_keys=False)


def main() -> None:
    with postgres(), tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "policy.yaml"
        policy.write_text(policy_on_postgres())
        store, notes = dpsql.init(Path(tmp) / "store.duckdb", policy)  # imports nothing
        store.close()
        print("init:", *notes or ["the table matches the policy"])
        with dpsql.connect(Path(tmp) / "store.duckdb", "alice") as alice:
            answer = alice.sql("SELECT sex, COUNT(*), AVG(hours_per_week) FROM adult "
                               "GROUP BY sex")
            print(answer.notice)
            print(answer.table.to_pandas().to_string(index=False))
        with dpsql.connect(Path(tmp) / "store.duckdb", "admin") as admin:
            release = admin.release("adult", synthesizer="independent", name="adult_pg",
                                    epsilon=1, rows=1000, columns=["age", "sex", "race"])
            print(f"released {release.table} ({release.record['rows']} rows); its source was "
                  "streamed from PostgreSQL in batches")
            print(admin.sql("SELECT sex, COUNT(*) AS n FROM released.adult_pg GROUP BY sex "
                            "ORDER BY sex").table.to_pandas().to_string(index=False))


if __name__ == "__main__":
    main()
