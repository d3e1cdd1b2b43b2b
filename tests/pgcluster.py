"""A throwaway PostgreSQL cluster for tests: initdb + pg_ctl on a free port, stopped after.

The superuser ``postgres`` has a password; ``reader`` may only SELECT. Running
as root, the server runs as the ``postgres`` OS user (initdb refuses root).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPER_PASSWORD = "s3cret-super-pw"
READER_PASSWORD = "r3ader-pw-never-shown"


def initdb_path() -> str | None:
    """The newest installed initdb, or None (the Debian ``postgresql`` package is missing)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(
        p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return found[-1] if found else shutil.which("initdb")


@dataclass(frozen=True)
class Cluster:
    """A running cluster: where to reach it, as the superuser or the read-only role."""

    port: int

    def dsn(self, user: str = "reader", password: str | None = None) -> str:
        text = f"host=127.0.0.1 port={self.port} dbname=postgres user={user}"
        return text + (f" password={password}" if password else "")

    def admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn("postgres", SUPER_PASSWORD), autocommit=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@contextmanager
def cluster() -> Iterator[Cluster]:
    """Start a cluster in a fresh directory; stop it and remove the directory at the end."""
    initdb = initdb_path()
    if initdb is None:
        raise FileNotFoundError("initdb is not installed (apt-get install postgresql)")
    bindir = Path(initdb).parent
    root = Path(tempfile.mkdtemp(prefix="dpsql-pg-"))
    data, pwfile = root / "data", root / "pw"
    pwfile.write_text(SUPER_PASSWORD + "\n")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(pwfile, "postgres")
    root.chmod(0o700)
    port = _free_port()
    run = dict(check=True, capture_output=True, cwd=root)
    subprocess.run(_as_postgres([initdb, "-D", str(data), "-U", "postgres", "-E", "UTF8",
                                 "--locale=C.UTF-8", "--auth=scram-sha-256",
                                 f"--pwfile={pwfile}"]), **run)  # type: ignore[call-overload]
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"
    subprocess.run(_as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-o", options,
                                 "-l", str(root / "log"), "-w", "start"]),
                   **run)  # type: ignore[call-overload]
    try:
        found = Cluster(port)
        with found.admin() as con:
            con.execute(f"CREATE ROLE reader LOGIN PASSWORD '{READER_PASSWORD}'")
        yield found
    finally:
        subprocess.run(_as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                                     "-w", "stop"]), capture_output=True, cwd=root)
        shutil.rmtree(root, ignore_errors=True)


_PG_TYPES = {"BIGINT": "bigint", "INTEGER": "integer", "SMALLINT": "smallint",
             "DOUBLE": "double precision", "FLOAT": "real", "VARCHAR": "text",
             "BOOLEAN": "boolean", "DATE": "date"}


def copy_table(cluster_: Cluster, duck: Any, source: str, target: str) -> None:
    """Copy DuckDB table ``source`` (a cursor's) into PostgreSQL ``target``, readable by reader."""
    relation = duck.sql(f"SELECT * FROM {source}")
    columns = ", ".join(f'"{name}" {_PG_TYPES[str(kind)]}'
                        for name, kind in zip(relation.columns, relation.types, strict=True))
    rows = relation.fetchall()
    with cluster_.admin() as con:
        con.execute(f"CREATE TABLE {target} ({columns})")
        with con.cursor().copy(f"COPY {target} FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        con.execute(f"GRANT SELECT ON {target} TO reader")
