"""Engines: where a dataset's rows live and its generated SQL runs (DuckDB, PostgreSQL, Spark).

Below both the query path and releases: :func:`engine_for` picks a dataset's
engine; :mod:`dpsql.engines.source` is the bounded source every engine runs;
:mod:`dpsql.engines.interrupt` stops a statement's work. Another engine
implements :class:`dpsql.engines.base.Engine` and is added in :func:`engine_for`
(docs/engines.md).
"""

from __future__ import annotations

from dpsql.engines.base import Engine, Links
from dpsql.engines.interrupt import Interrupter
from dpsql.engines.local import DuckDBEngine
from dpsql.errors import ConfigurationError
from dpsql.policy import Dataset
from dpsql.store import Store


def engine_for(dataset: Dataset, store: Store, interrupts: Interrupter,
               links: Links | None = None) -> Engine:
    """The engine that holds ``dataset``'s rows, for one statement (close it after).

    ``links``: the session's kept connections, reused and given back at close.
    """
    if dataset.engine is None:
        return DuckDBEngine(store, interrupts)
    if dataset.engine.kind == "spark":
        try:
            from dpsql.engines.spark import SparkEngine  # pyspark only where it is used
        except ImportError as err:
            raise ConfigurationError(f"dataset {dataset.name} lives in Spark, which needs "
                                     "pyspark: pip install 'dpsql[spark]'") from err
        return SparkEngine(dataset.engine, interrupts)
    try:
        from dpsql.engines.postgres import PostgresEngine  # psycopg only where it is used
    except ImportError as err:
        raise ConfigurationError(f"dataset {dataset.name} lives in PostgreSQL, which needs "
                                 "psycopg: pip install 'dpsql[postgres]'") from err
    return PostgresEngine(dataset.engine, interrupts, links)
