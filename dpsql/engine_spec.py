"""A dataset's engine as its policy states it: PostgreSQL or Spark, never a credential.

Part of the policy (:mod:`dpsql.policy` reads it from a dataset's ``engine:``);
its own module because a dataset on another engine has rules of its own: a
connection string that names no password, a Spark table or Parquet path.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from dpsql.errors import ConfigurationError, PolicyError


@dataclass(frozen=True)
class EngineSpec:
    """Where a dataset's rows live when not in the store: PostgreSQL or Spark.

    The policy holds no credential: the connection string comes from the
    environment variable ``dsn_env``, or is ``dsn`` (refused if it holds a
    password) with the password from the environment variable ``password_env``.
    A Spark dataset names a ``table`` of the session's catalog or a Parquet
    ``path``, and the ``master`` to run on (None: $SPARK_MASTER, else local[2]).
    """

    kind: Literal["postgres", "spark"]
    table: str | None = None  # schema.table on PostgreSQL, [database.]table on Spark
    dsn: str | None = None
    dsn_env: str | None = None
    password_env: str | None = None
    path: str | None = None
    master: str | None = None

    @property
    def schema_name(self) -> str:
        """The schema part of ``table``."""
        return self.name_parts[0]

    @property
    def table_name(self) -> str:
        """The table part of ``table``."""
        return self.name_parts[-1]

    @property
    def name_parts(self) -> tuple[str, ...]:
        """The table's name on the engine, part by part (a path is read as a view of it)."""
        if self.path is not None:
            return (f"_dpsql_parquet_{hashlib.sha256(self.path.encode()).hexdigest()[:16]}",)
        assert self.table is not None
        return tuple(self.table.split("."))

    @property
    def product(self) -> str:
        """The engine's name as people write it."""
        return {"postgres": "PostgreSQL", "spark": "Spark"}[self.kind]

    @property
    def location(self) -> str:
        """What messages name: the table, or the Parquet path."""
        return self.table if self.table is not None else f"Parquet {self.path}"


def read_engine(raw: dict[str, Any], source: str, where: str) -> EngineSpec:
    """The dataset's engine; a ``dsn`` written in the policy may not hold a password."""
    if raw["kind"] == "spark":
        return _spark_engine(raw, source, where)
    if "table" not in raw or "." not in raw["table"]:
        raise _fail(source, where + ".table", "a PostgreSQL dataset names its table as "
                    "schema.table (e.g. public.visits)")
    if "path" in raw or "master" in raw:
        raise _fail(source, where, "path and master are Spark settings; a PostgreSQL dataset "
                    "names a dsn and a table")
    if ("dsn" in raw) == ("dsn_env" in raw):
        raise _fail(source, where, "give exactly one of dsn (without a password) or dsn_env "
                    "(the name of an environment variable holding the connection string)")
    if "password_env" in raw and "dsn" not in raw:
        raise _fail(source, where + ".password_env", "password_env goes with dsn (a dsn_env "
                    "connection string carries its own password)")
    if "dsn" in raw and _has_password(raw["dsn"]):
        raise _fail(source, where + ".dsn", "the dsn holds a password, and the policy is shown "
                    "to analysts: remove it and name an environment variable holding it with "
                    "password_env")
    return EngineSpec(kind=raw["kind"], table=raw["table"], dsn=raw.get("dsn"),
                      dsn_env=raw.get("dsn_env"), password_env=raw.get("password_env"))


def _spark_engine(raw: dict[str, Any], source: str, where: str) -> EngineSpec:
    """A Spark dataset: exactly one of a catalog table or a Parquet path, no credentials."""
    if ("table" in raw) == ("path" in raw):
        raise _fail(source, where, "a Spark dataset gives exactly one of table (a table of "
                    "the Spark catalog) or path (a Parquet file or directory)")
    extra = sorted({"dsn", "dsn_env", "password_env"} & set(raw))
    if extra:
        raise _fail(source, where + "." + extra[0], "a Spark dataset takes no connection "
                    "string: name the cluster with master (or $SPARK_MASTER)")
    return EngineSpec(kind="spark", table=raw.get("table"), path=raw.get("path"),
                      master=raw.get("master"))


def _has_password(dsn: str) -> bool:
    """Whether a libpq connection string (key=value or URI) carries a password."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError as err:
        raise ConfigurationError("a dataset on PostgreSQL needs psycopg: pip install "
                                 "'dpsql[postgres]'") from err
    try:
        return "password" in conninfo_to_dict(dsn)
    except Exception:
        return True


def _fail(source: str, where: str, message: str) -> PolicyError:
    return PolicyError(f"{source}: {where}: {message}")
