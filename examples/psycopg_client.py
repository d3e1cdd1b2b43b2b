"""Reach dpsql from psycopg and pandas over the PostgreSQL wire protocol.

    python examples/psycopg_client.py

Builds a store from the bundled Adult sample, gives the analyst alice a password,
starts `dpsql serve` on a free port, and then does what an analyst's notebook
does: a DP aggregate (with the cost NOTICE), a parameterized query, the budget,
a refusal and its SQLSTATE, and a pandas DataFrame. The server is stopped at the
end (SIGTERM, a clean shutdown).
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pandas as pd
import psycopg

import dpsql
from dpsql import passwords

DATA = Path(str(resources.files("dpsql").joinpath("data")))
PASSWORD = "alice-notebook-1"


def start_server(db: Path) -> tuple[subprocess.Popen[str], int]:
    """`dpsql serve` in a subprocess; returns it and the port it listens on."""
    server = subprocess.Popen([sys.executable, "-m", "dpsql", "serve", "--db", str(db),
                               "--port", "0"], stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    for line in server.stderr:
        print("  server:", line.rstrip())
        match = re.search(r"listening on [\d.]+:(\d+)", line)
        if match:
            return server, int(match.group(1))
    raise RuntimeError("the server did not start")


@contextlib.contextmanager
def serving(db: Path) -> Iterator[int]:
    """A server on ``db`` for the block (its port), stopped after it (SIGTERM)."""
    server, port = start_server(db)
    try:
        yield port
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        print("server stopped with exit code", server.returncode)


def main() -> None:
    if importlib.util.find_spec("dpsql.query") is None:  # the engine behind session.sql
        print("this build of dpsql has no SQL engine yet (dpsql.query); nothing to serve")
        return
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "adult.duckdb"
        store, _ = dpsql.init(db, DATA / "adult.yaml", {"adult": DATA / "adult_sample.csv"})
        passwords.set_password(store, "alice", PASSWORD)  # what `dpsql user add alice` does
        store.close()

        with serving(db) as port:
            dsn = f"host=127.0.0.1 port={port} dbname=adult user=alice password={PASSWORD}"
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.add_notice_handler(lambda d: print("  NOTICE:", d.message_primary))

                print("1. A DP count by sex (the default per-query cost):")
                for row in conn.execute("SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex "
                                        "ORDER BY sex"):
                    print("  ", row)

                print("2. A parameterized query at a chosen epsilon:")
                conn.execute("SET dpsql.epsilon = 0.2")
                row = conn.execute("SELECT COUNT(*) FROM adult WHERE age >= %s", [40]).fetchone()
                print("   people aged 40 or more (noisy):", row[0])

                print("3. What is left of the budget:")
                for row in conn.execute("SHOW dpsql.budget"):
                    print("  ", row)

                print("4. Raw rows are refused, with a SQLSTATE a program can test:")
                try:
                    conn.execute("SELECT * FROM adult LIMIT 5")
                except psycopg.Error as err:
                    print(f"   {err.sqlstate}: {err.diag.message_primary}")

                print("5. pandas reads DP answers like any table:")
                with warnings.catch_warnings():
                    # pandas only tests SQLAlchemy connectables; a psycopg connection works.
                    warnings.filterwarnings("ignore", message=".*SQLAlchemy.*")
                    frame = pd.read_sql("SELECT race, COUNT(*) AS n FROM adult GROUP BY race "
                                        "ORDER BY race", conn)
                print(frame.to_string(index=False))


if __name__ == "__main__":
    main()
