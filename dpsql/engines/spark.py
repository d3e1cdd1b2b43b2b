"""SparkEngine: the engine of a dataset whose rows live in Spark (a catalog table or Parquet).

The process holds one SparkSession (``getOrCreate``: the first dataset's master
starts it, later ones share it). The SQL is dpsql's plan rendered in sqlglot's
spark dialect (after :func:`to_spark` rewrites the few operators whose meaning
differs), never the analyst's text, and only a query runs: nothing is written.
``spark.sql`` analyses a query without reading a row, which is the bind before
the charge; the job runs after it, in a job group of its own, so a cancel
(statement timeout or user request) cancels that group's jobs on the cluster.
Spark has no CHECK constraints and no snapshot across queries: every value is
clamped, and a Parquet path's files are read when the query runs.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction

import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from sqlglot import exp

from dpsql.engine_spec import EngineSpec
from dpsql.engines.base import EngineError
from dpsql.engines.interrupt import Interrupter
from dpsql.errors import QueryCanceled

log = logging.getLogger(__name__)
DEFAULT_MASTER = "local[2]"
_ERRORS = (PySparkException, Py4JError)
_groups = itertools.count()

#: Spark's simpleString of a column type -> the DuckDB name the planner knows.
_TYPES = {
    "tinyint": "TINYINT", "smallint": "SMALLINT", "int": "INTEGER", "bigint": "BIGINT",
    "float": "FLOAT", "double": "DOUBLE", "string": "VARCHAR", "boolean": "BOOLEAN",
    "date": "DATE", "timestamp": "TIMESTAMP WITH TIME ZONE", "timestamp_ntz": "TIMESTAMP",
}


def session(spec: EngineSpec) -> SparkSession:
    """The process's SparkSession, started on the spec's master if none runs yet."""
    master = spec.master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER
    if master.startswith("local"):  # the Python workers run here: this one, with its pyarrow
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        return (SparkSession.builder.master(master).appName("dpsql")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.session.timeZone", "UTC")  # dates and times as text
                .getOrCreate())
    except (*_ERRORS, RuntimeError) as err:
        log.warning("cannot start Spark on %s: %s", master, _first_line(err))
        raise EngineError(f"cannot start Spark on master {master}") from None


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


class _Cancel:
    """What :class:`Interrupter` interrupts: the statement's Spark job group."""

    def __init__(self, spark: SparkSession, group: str) -> None:
        self._spark = spark
        self.group = group
        self.fired = False

    def interrupt(self) -> None:
        self.fired = True
        self._spark.sparkContext.cancelJobGroup(self.group)


class _SparkPrepared:
    """An analysed query (a lazy DataFrame), run once in the statement's job group."""

    def __init__(self, engine: SparkEngine, frame: DataFrame, text: str) -> None:
        self._engine = engine
        self._frame = frame
        self.text = text

    def run(self) -> pa.Table:
        with self._engine.querying():
            return self._frame.toArrow()


class SparkEngine:
    """Runs one statement's queries on a Spark table or Parquet path, read only."""

    dialect = "spark"

    def __init__(self, spec: EngineSpec, interrupts: Interrupter | None = None) -> None:
        self.spec = spec
        self.interrupts = interrupts or Interrupter()
        self._spark: SparkSession | None = None
        self._group = f"dpsql-{os.getpid()}-{next(_groups)}"

    def _session(self) -> SparkSession:
        """The session, with a Parquet path's rows as a temporary view of the name SQL uses."""
        if self._spark is None:
            spark = session(self.spec)
            if self.spec.path is not None:
                with self._errors():
                    spark.read.parquet(self.spec.path).createOrReplaceTempView(
                        self.spec.name_parts[0])
            self._spark = spark
        return self._spark

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Spark's errors as EngineError, with their first line.

        It can quote a value (an ANSI error names the operand); after a charge the
        analyst gets dpsql's fixed reply instead, and before it no row is read.
        """
        try:
            yield
        except _ERRORS as err:
            raise EngineError(_first_line(err)) from err

    @contextmanager
    def querying(self) -> Iterator[SparkSession]:
        """Jobs of this statement's group, which the interrupter can cancel."""
        spark = self._session()
        cancel = _Cancel(spark, self._group)
        context = spark.sparkContext
        context.setJobGroup(self._group, "dpsql statement", interruptOnCancel=True)
        try:
            with self.interrupts.running(cancel), self._errors():
                yield spark
        except EngineError:
            if cancel.fired:
                raise QueryCanceled() from None
            raise
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]

    def close(self) -> None:
        """Nothing to release: the session is the process's and nothing was written."""
        self._spark = None

    def render(self, query: exp.Expr) -> str:
        """The query as Spark SQL."""
        return to_spark(query).sql(dialect=self.dialect)

    def prepare(self, query: exp.Expr, text: str | None = None) -> _SparkPrepared:
        """Analyse the query: names and types bind, no job runs; only a query is accepted."""
        if not isinstance(query, exp.Query):
            raise EngineError("dpsql runs only queries on Spark (read only)")
        text = text if text is not None else self.render(query)
        with self._errors():
            return _SparkPrepared(self, self._session().sql(text), text)

    def execute(self, query: exp.Expr) -> pa.Table:
        """Bind and run ``query``."""
        return self.prepare(query).run()

    def stream(self, query: exp.Expr, schema: pa.Schema, size: int = 1 << 16
               ) -> Iterator[pa.RecordBatch]:
        """``query``'s rows as Arrow batches of at most ``size`` rows, a partition at a time.

        The executors write each partition as compressed Arrow IPC chunks of
        ``size`` rows (``mapInArrow``); a REBALANCE spreads the chunks over
        partitions of about Spark's advisory size (AQE:
        ``spark.sql.adaptive.advisoryPartitionSizeInBytes``, 64 MB), whatever the
        input's partitions; ``toLocalIterator`` brings one of them to the driver
        at a time. So memory here does not grow with the table, and no row becomes
        a Python object.
        """
        with self._errors(), warnings.catch_warnings():  # analysis only: no job runs
            # pyspark warns about pandas 3 on any Arrow UDF; this one uses no pandas
            warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas",
                                    FutureWarning)
            frame = self._session().sql(self.render(query)).mapInArrow(
                _ipc_chunks(size), "chunk binary").hint("rebalance")
        with self.querying():
            for row in frame.toLocalIterator():
                with pa.ipc.open_stream(pa.py_buffer(row.chunk)) as reader:
                    for batch in reader:
                        yield batch.cast(schema)

    def column_types(self, table: str) -> dict[str, str]:
        """Column name -> type (DuckDB's name for it) of the engine's table, from its schema.

        ``table``: the dataset's table name in the policy; the engine reads the
        table or path its spec names.
        """
        name = ".".join(f"`{part}`" for part in self.spec.name_parts)
        try:
            with self._errors():
                fields = self._session().table(name).schema.fields
        except EngineError as err:
            raise EngineError(f"no table {self.spec.location} on Spark ({err.message})") from None
        return {f.name: _duckdb_type(f.dataType.simpleString()) for f in fields}

    def enforced_bounds(self, table: str) -> dict[str, tuple[Fraction, Fraction]]:
        """Spark keeps no CHECK constraints: none, so every bounded column is clamped."""
        return {}


def _ipc_chunks(size: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """What each Spark task runs: its batches regrouped into Arrow IPC chunks of ``size`` rows.

    A closure that uses pyarrow only, so cloudpickle ships it by value: the
    executors need pyarrow (as any Arrow transfer does) but not dpsql.
    """
    def chunks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        def blob(rows: list[pa.RecordBatch]) -> pa.RecordBatch:
            sink = pa.BufferOutputStream()
            options = pa.ipc.IpcWriteOptions(compression="zstd")  # what the shuffle sizes
            with pa.ipc.new_stream(sink, rows[0].schema, options=options) as out:
                out.write_table(pa.Table.from_batches(rows).combine_chunks())  # one batch
            return pa.RecordBatch.from_pydict({"chunk": [sink.getvalue().to_pybytes()]})

        held: list[pa.RecordBatch] = []
        count = 0
        for batch in batches:
            while batch.num_rows:
                part = batch.slice(0, size - count)
                held.append(part)
                count += part.num_rows
                batch = batch.slice(part.num_rows)
                if count == size:
                    yield blob(held)
                    held, count = [], 0
        if held:
            yield blob(held)
    return chunks


def _duckdb_type(kind: str) -> str:
    if kind.startswith("decimal"):
        return kind.upper()
    return _TYPES.get(kind, kind.upper())


def to_spark(query: exp.Expr) -> exp.Expr:
    r"""The plan with DuckDB operators that Spark reads differently rewritten.

    ``SUM`` adds in DECIMAL(38, 0): Spark's SUM of BIGINT is a BIGINT that raises
    on overflow (ANSI mode), after the charge, where DuckDB's HUGEINT total is
    capped. Row conditions need nothing: their arithmetic is in DOUBLE already
    (:mod:`dpsql.query.predicates`), so Spark's decimal division never applies.
    A LIKE pattern's backslashes are doubled: DuckDB's LIKE has no escape
    character, Spark's is the backslash (an explicit ESCAPE is kept).
    ``COLLATE "C"`` goes: Spark compares strings in byte order already.
    """
    def rewrite(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Collate):
            return node.this.transform(rewrite)
        if isinstance(node, exp.Sum):
            return exp.Sum(this=exp.cast(node.this.transform(rewrite), "DECIMAL(38, 0)"))
        if isinstance(node, exp.Escape):  # its own escape character, as written
            like = node.this.copy()
            for key in ("this", "expression"):
                like.set(key, like.args[key].transform(rewrite))
            return exp.Escape(this=like, expression=node.expression.copy())
        if isinstance(node, (exp.Like, exp.ILike)):
            pattern = exp.Anonymous(this="replace", expressions=[
                node.expression.transform(rewrite), exp.Literal.string("\\"),
                exp.Literal.string("\\\\")])
            return node.__class__(this=node.this.transform(rewrite), expression=pattern)
        return node

    return query.copy().transform(rewrite, copy=False)
