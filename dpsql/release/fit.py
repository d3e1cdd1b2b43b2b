"""What a release's worker process runs: the bounded source in, a fitted and sampled table out.

The owner exports the bounded source's contingency table (:func:`export_source`);
the worker expands it back to rows, fits the synthesizer with the budget already
charged, samples and decodes (:func:`synthesize`, :func:`sample_more`), and
leaves the results in the job's private folder (:class:`Synthetic`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
import sqlglot

from dpsql import provenance
from dpsql.domain import Domain, quote
from dpsql.engines import engine_for
from dpsql.engines.interrupt import Interrupter
from dpsql.engines.source import bounded_sql
from dpsql.errors import (
    InternalError,
    ReleaseError,
)
from dpsql.policy import Dataset
from dpsql.privacy import PrivacyCost
from dpsql.progress import Progress, silent
from dpsql.store import HARDENED_CONFIG, Store
from dpsql.synth import base as synth_base
from dpsql.synth import shape

if TYPE_CHECKING:
    pass


COPY_COLUMN = "_copy"


@dataclass(frozen=True)
class FitSpec:
    """A fit and its sampling, sent to the worker process."""

    synth: Any
    synth_name: str
    domain: Domain
    cost: PrivacyCost
    seed: int
    rows: int | None
    copies: int


SOURCE_FILE = "source.arrow"


def export_source(store: Store, dataset: Dataset, columns: Sequence[str], path: Path,
                  types: Mapping[str, str], interrupts: Interrupter | None = None) -> None:
    """Write the bounded source's contingency table over ``columns`` to ``path`` (Arrow IPC).

    The engine groups the bounded rows by the release's domain and counts them
    (NULL is a group like any other), so only distinct domain rows and their
    counts leave it: no hidden column, no privacy unit, no column outside the
    policy, and on a cluster the aggregation that shrinks the data runs there.
    The counts come last, in a column named by :func:`weight_column`. They
    arrive in batches from the dataset's engine (the store's connection, which
    has no file access, or another engine), so memory here does not grow with
    the table; ``types``: the table's column types; ``interrupts`` can stop the
    engine's query.
    """
    names = ", ".join(quote(c) for c in columns)
    weight = weight_column(columns)
    query = sqlglot.parse_one(f"SELECT {names}, count(*) AS {quote(weight)} FROM "
                              f"{bounded_sql(dataset, store.secret, types)} GROUP BY {names}",
                              read="duckdb")
    empty = ", ".join([f"CAST(NULL AS {types[c]}) AS {quote(c)}" for c in columns]
                      + [f"CAST(NULL AS BIGINT) AS {quote(weight)}"])
    schema = duckdb.connect().sql(f"SELECT {empty}").to_arrow_table().schema
    engine = engine_for(dataset, store, interrupts or Interrupter())
    try:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as out:
            for batch in engine.stream(query, schema):
                out.write_batch(batch)
    finally:
        engine.close()


def weight_column(columns: Sequence[str]) -> str:
    """The exported counts' column: ``rows``, prefixed with ``_`` until no column has it."""
    name = "rows"
    while name in columns:
        name = "_" + name
    return name


def expanded(con: duckdb.DuckDBPyConnection, counts: pa.Table) -> duckdb.DuckDBPyRelation:
    """The rows the contingency table ``counts`` stands for: each distinct row repeated its count.

    The counts are copied into ``con`` sorted: the engine's GROUP BY hands groups
    back in any order, and a seeded fit must see the same rows in the same order
    on every run and every engine. The expansion is lazy (DuckDB unnests the
    counts as it scans), so the worker's synthesizers read one row per bounded
    source row, as before, without holding them.
    """
    *columns, weight = counts.schema.names
    con.register("_exported", counts)
    con.execute("CREATE TABLE counts AS SELECT * FROM _exported ORDER BY ALL")
    con.unregister("_exported")
    names = ", ".join(quote(c) for c in columns)
    return con.sql(f"SELECT {names} FROM (SELECT {names}, "
                   f"unnest(range({quote(weight)})) FROM counts)")


def read_arrow(path: Path) -> pa.Table:
    """An Arrow IPC file written by :func:`save_arrow` or :func:`export_source`."""
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def save_arrow(table: pa.Table, path: Path) -> None:
    """Write ``table`` as an Arrow IPC file."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
        out.write_table(table)


@dataclass(frozen=True)
class Synthetic:
    """What a fit and its sampling produced (post-processing of the DP fit only)."""

    table: pa.Table
    products: dict[str, pa.Table]
    description: dict[str, Any]  # JSON-able
    state: str | None  # the fitted state as JSON, when the synthesizer keeps one
    spent: PrivacyCost
    rows: int
    copies: int
    output: str  # "rows" or "representation"

    def save(self, folder: Path) -> None:
        """Write the tables as Arrow IPC files and the rest as JSON into ``folder``."""
        save_arrow(self.table, folder / "table.arrow")
        for i, product in enumerate(self.products.values()):
            save_arrow(product, folder / f"product_{i}.arrow")
        meta = {"products": list(self.products), "description": self.description,
                "state": self.state, "rows": self.rows, "copies": self.copies,
                "output": self.output, "spent": [self.spent.kind, str(self.spent.units),
                                                 self.spent.infinite]}
        (folder / "result.json").write_text(json.dumps(meta), "utf-8")

    @classmethod
    def load(cls, folder: Path) -> Synthetic:
        """Read what :meth:`save` wrote."""
        meta = json.loads((folder / "result.json").read_text("utf-8"))
        products = {suffix: read_arrow(folder / f"product_{i}.arrow")
                    for i, suffix in enumerate(meta["products"])}
        kind, units, infinite = meta["spent"]
        return cls(read_arrow(folder / "table.arrow"), products, meta["description"],
                   meta["state"], PrivacyCost(kind, int(units), infinite), meta["rows"],
                   meta["copies"], meta["output"])


def synthesize(folder: Path, plan: FitSpec, *, report: Progress) -> None:
    """In the worker: fit on the exported source, sample, and save the results in ``folder``.

    DuckDB spills into ``folder`` too, which is removed or swept whatever happens
    (its default, ``./.tmp``, would keep the rows of a killed worker).
    """
    con = duckdb.connect(":memory:", config={**HARDENED_CONFIG,
                                             "temp_directory": str(folder / "spill")})
    try:
        fit_and_sample(expanded(con, read_arrow(folder / SOURCE_FILE)), plan, report
                       ).save(folder)
    finally:
        con.close()


def fit_and_sample(source: duckdb.DuckDBPyRelation, plan: FitSpec, report: Progress
                   ) -> Synthetic:
    """Fit ``plan``'s synthesizer on ``source`` with its budget and seed, then sample.

    When the policy asks for within-bin shapes (``decode: shape``) of a DP
    release that samples rows, :data:`shape.SHARE` of the budget measures them
    and the synthesizer fits with the rest; a representation (``range``) decodes
    nothing and keeps its whole budget. ``spent``: every measurement's cost, the
    fit's and the shapes' (what the provenance records against the charge).
    """
    rng = np.random.default_rng(plan.seed)
    samples = getattr(plan.synth, "output", "rows") == "rows"
    shaped = shape.shaped(plan.domain) if samples and not plan.cost.is_zero else []
    budget, shape_budget = plan.cost.split([1 - shape.SHARE, shape.SHARE]) if shaped \
        else (plan.cost, None)
    report("fit", 0, None)
    with warnings.catch_warnings():  # reported in the release's own warnings instead
        warnings.simplefilter("ignore", synth_base.SynthesizerWarning)
        fitted = plan.synth.fit(source, plan.domain, budget, rng, report)
    spent, shapes = fitted.spent, None
    if callable(getattr(fitted, "representation", None)):
        table = fitted.representation()
        rows, copies, output = table.num_rows, 1, "representation"
    else:
        rows = plan.rows if plan.rows is not None else int(fitted.rows)
        if rows <= 0:
            raise ReleaseError(f"{plan.synth_name} estimated {rows} rows; pass --rows N")
        copies, output = plan.copies, "rows"
        domain = plan.domain
        if shape_budget is not None:
            shapes = shape.measure(source, domain, shaped, shape_budget)
            spent = spent.to(shapes.cost.kind) + shapes.cost
            domain = domain.with_shapes(shapes.probabilities)
        table = sample_copies(fitted, domain, rows, range(1, copies + 1), rng,
                              with_copy_column=copies > 1, report=report)
    description = provenance.jsonable(dict(fitted.describe()))  # after sampling: diagnostics
    if shapes is not None:
        description["within_bin_shapes"] = provenance.jsonable(shapes.describe())
    products = getattr(fitted, "products", None)
    extra = dict(products().items()) if callable(products) else {}
    state = provenance.to_json(fitted.state()) \
        if callable(getattr(fitted, "state", None)) else None
    return Synthetic(table, extra, description, state, spent, rows, copies, output)


def sample_copies(fitted: Any, domain: Domain, rows: int, copy_numbers: Sequence[int],
                  rng: np.random.Generator, *, with_copy_column: bool,
                  report: Progress = silent) -> pa.Table:
    """Sample, check and decode one table per copy number (post-processing only)."""
    parts = []
    total = len(copy_numbers)
    for i, number in enumerate(copy_numbers):
        report("sample", i, total)
        codes = fitted.sample(rows, rng)
        _check_codes(codes, domain, rows)
        decoded = domain.decode(codes.select(list(domain.names)), rng)
        if with_copy_column:
            decoded = decoded.append_column(COPY_COLUMN,
                                            pa.array(np.full(rows, number, dtype=np.int32)))
        parts.append(decoded)
    report("sample", total, total)
    return pa.concat_tables(parts)


def _check_codes(codes: pa.Table, domain: Domain, rows: int) -> None:
    """A sample must give every domain column, ``rows`` rows, codes inside the domain."""
    missing = [n for n in domain.names if n not in codes.column_names]
    if missing or codes.num_rows != rows:
        raise InternalError(f"the synthesizer sampled a table without columns {missing} or with "
                            f"{codes.num_rows} rows instead of {rows}; this is a bug in it")
    for attribute in domain.attributes:
        values = codes.column(attribute.name).to_numpy(zero_copy_only=False)
        if values.size and (values.min() < 0 or values.max() >= attribute.size):
            raise InternalError(f"the synthesizer sampled codes outside the domain of "
                                f"{attribute.name!r}; this is a bug in it")


def sample_more(folder: Path, synth: Any, state: str, domain: Domain, rows: int,
                numbers: list[int], seed: int, *, report: Progress) -> None:
    """In the worker: restore the stored DP state and sample copies ``numbers`` into ``folder``."""
    fitted = synth.restore(json.loads(state), domain)
    table = sample_copies(fitted, domain, rows, numbers, np.random.default_rng(seed),
                          with_copy_column=True, report=report)
    Synthetic(table, {}, {}, None, PrivacyCost.zero("zcdp"), rows, len(numbers),
              "rows").save(folder)
