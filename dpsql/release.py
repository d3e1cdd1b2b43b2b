"""Synthetic releases in three phases: prepare (owner), fit and sample (worker), write (owner).

1. :func:`prepare`, in the process that owns the store: checks that need nothing
   private (role, name, policy, synthesizer, options, columns, budget
   arithmetic, the synthesizer's own public ``check``; a refusal is audited
   and costs nothing), then the ledger charges the budget (DP synthesizers
   only) and commits. :meth:`Charged.export` then asks the dataset's engine (the store,
   PostgreSQL or Spark) for the bounded source's contingency table over the
   release's domain (distinct rows and their counts) and streams it to a
   private folder (Arrow IPC).
2. :func:`synthesize`, in a worker process (see :mod:`dpsql.jobs`): fit on that
   table expanded back to one row per source row (lazily, in DuckDB), sample,
   decode; the results go back to the folder as Arrow IPC and JSON.
3. :meth:`Charged.write`, in the owner: one DuckDB transaction checks and writes
   ``released.<name>``, any extra DP products, the provenance row (also the
   table COMMENT) and the resumable state.

A failure after the charge leaves the charge (budget is never refunded) and
nothing else. Non-DP synthesizers need ``allow_non_dp: true`` in the policy,
are labelled ``privacy: empirical`` and spend no budget, but are audited.
"""

from __future__ import annotations

import json
import secrets
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import duckdb
import numpy as np
import pyarrow as pa
import sqlglot

from dpsql import __version__, provenance
from dpsql.domain import Domain, quote
from dpsql.engines import engine_for
from dpsql.engines.interrupt import Interrupter
from dpsql.engines.source import bounded_sql
from dpsql.errors import (
    ConfigurationError,
    DPSQLError,
    InternalError,
    PolicyError,
    ReleaseError,
)
from dpsql.imports import table_columns
from dpsql.ledger import Outcome
from dpsql.policies import dataset_columns
from dpsql.policy import Dataset
from dpsql.privacy import Number, PrivacyCost
from dpsql.progress import Progress, silent
from dpsql.store import HARDENED_CONFIG, Store, check_identifier, now
from dpsql.synth import base as synth_base
from dpsql.synth import shape

if TYPE_CHECKING:
    from dpsql.context import Context

COPY_COLUMN = "_copy"
#: Called with a release's work and its arguments once the request is checked, before the charge.
Start = Callable[[Callable[..., None], tuple[Any, ...]], None]


@dataclass(frozen=True)
class Release:
    """A written release: its table name, provenance record and warnings to show.

    ``held``: why the release is unpublished (its fit failed a diagnostic check),
    or "" for a published one.
    """

    name: str
    release_id: str
    record: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    held: str = ""

    @property
    def table(self) -> str:
        """The qualified table name: ``released.<name>``, or ``held.<name>`` while unpublished."""
        return str(self.record.get("table", f"released.{self.name}"))


@dataclass
class _Plan:
    """Everything decided before the charge, from public information only."""

    dataset: Dataset
    synth: Any
    synth_name: str
    options: dict[str, Any]
    domain: Domain
    cost: PrivacyCost
    dp: bool
    rows: int | None
    copies: int
    name: str
    seed: int
    seed_source: str
    previous: dict[str, Any] | None
    warnings: list[str]
    statement: str
    types: dict[str, str]  # the dataset table's column types, read before the charge

    def fit_spec(self) -> FitSpec:
        """What the worker needs to fit and sample (no policy objects: those stay here)."""
        return FitSpec(self.synth, self.synth_name, self.domain, self.cost, self.seed, self.rows,
                       self.copies)


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


@dataclass(frozen=True)
class ReleaseRequest:
    """What an administrator asks to release (checked in :func:`prepare`)."""

    dataset: str
    synthesizer: str
    name: str
    epsilon: Number | None = None
    delta: Number | None = None
    rho: Number | None = None
    rows: int | None = None
    copies: int = 1
    columns: Sequence[str] | None = None
    seed: int | None = None
    replace: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)

    kind: ClassVar[str] = "release"


@dataclass(frozen=True)
class MoreRequest:
    """More copies of a resumable release ``name`` (no privacy cost)."""

    name: str
    copies: int
    seed: int | None = None

    kind: ClassVar[str] = "release_more"


@dataclass(frozen=True)
class Charged:
    """A request checked, charged and audited: what a worker computes and the owner writes.

    ``work(folder, *args, report=...)`` runs in the worker process and leaves its
    results in ``folder``; :meth:`write` reads them back in the owner.
    """

    kind: str
    name: str
    dataset: str
    synthesizer: str
    audit_id: int
    kept: str  # "; the charge of ... stays", or "" when nothing was charged
    work: Callable[..., None]
    args: tuple[Any, ...]
    plan: _Plan | None = None  # a fresh release
    entry: dict[str, Any] | None = None  # release-more: the live release it extends

    def export(self, ctx: Context, folder: Path, interrupts: Interrupter) -> None:
        """Write what the worker reads (the bounded source of a fresh release) to ``folder``.

        ``interrupts`` stops the engine's query (a cancelled job): QueryCanceled.
        """
        if self.plan is not None:
            export_source(ctx.store, self.plan.dataset, self.plan.domain.names,
                          folder / SOURCE_FILE, self.plan.types, interrupts)

    def write(self, ctx: Context, folder: Path, report: Progress) -> Release:
        """Validate the worker's results and write them in one transaction."""
        if self.plan is not None:
            return _write_fresh(ctx, self.plan, self.audit_id, Synthetic.load(folder), report)
        assert self.entry is not None
        return _write_more(ctx, self, Synthetic.load(folder), report)

    def failure(self, name: str) -> tuple[str, ReleaseError]:
        """The audit reason and the error to raise when the work failed with error ``name``."""
        return f"{name}{self.kept}", ReleaseError(
            f"the release failed ({name}); nothing was written{self.kept} (budget is never "
            "refunded); set DPSQL_DEBUG=1 for details")


def prepare(ctx: Context, request: ReleaseRequest | MoreRequest,
            start: Start | None = None) -> Charged:
    """Check ``request`` from public information, then charge and audit it (admins only).

    A refusal is audited and costs nothing; once this returns the charge is
    committed and stays whatever happens to the work. ``start(work, args)``
    runs after the checks and before the charge: the job starts its worker
    there, so a worker that cannot start is one more refusal.
    """
    if isinstance(request, MoreRequest):
        return _prepare_more(ctx, request, start)
    r = request
    opts = dict(r.options)
    statement = _statement(r.dataset, r.synthesizer, r.name, r.epsilon, r.delta, r.rho, r.rows,
                           r.copies, r.columns, r.seed, opts)
    ledger = ctx.ledger
    dataset_for_audit = r.dataset if r.dataset in ctx.policy.datasets else None
    try:
        ctx.require_admin("release synthetic data")
        plan = _plan(ctx, r.dataset, r.synthesizer, r.name, r.epsilon, r.delta, r.rho, r.rows,
                     r.copies, r.columns, r.seed, r.replace, opts, statement)
        if start is not None:
            start(synthesize, (plan.fit_spec(),))
    except DPSQLError as err:
        ledger.record(ctx.user, dataset_for_audit, statement, Outcome.REFUSED, str(err),
                      action="release")
        raise
    if plan.dp:
        audit_id = ledger.charge(ctx.user, r.dataset, plan.cost, statement,
                                 action="release").id
        kept = f"; the charge of {plan.cost.describe(ctx.policy.delta)} stays"
    else:
        audit_id = ledger.record(ctx.user, r.dataset, statement, Outcome.STARTED,
                                 "not DP: labelled privacy: empirical, no budget spent",
                                 cost=PrivacyCost.zero(ctx.policy.accounting),
                                 action="release")
        kept = ""
    return Charged("release", plan.name, plan.dataset.name, plan.synth_name, audit_id, kept,
                   synthesize, (plan.fit_spec(),), plan=plan)


# -- planning (public information only) -------------------------------------------------


def _plan(ctx: Context, dataset_name: str, synth_name: str, name: str,
          epsilon: Number | None, delta: Number | None, rho: Number | None, rows: int | None,
          copies: int, columns: Sequence[str] | None, seed: int | None, replace_: bool,
          options: dict[str, Any], statement: str) -> _Plan:
    store, policy = ctx.store, ctx.policy
    check_identifier(name, "release name")
    _check_count(rows, "rows", allow_none=True)
    _check_count(copies, "copies")
    if seed is not None and (not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ConfigurationError(f"seed must be a non-negative integer, got {seed!r}")
    ds = policy.dataset(dataset_name)
    types = _source_types(store, ds)
    synth = synth_base.get(synth_name, **options)
    if synth_name not in ds.synthesizers:
        allowed = ", ".join(ds.synthesizers) or "none"
        raise ReleaseError(
            f"the policy does not allow synthesizer {synth_name!r} on dataset {ds.name!r} "
            f"(allowed: {allowed}); add it under datasets.{ds.name}.synthesizers and run "
            "dpsql policy apply")
    dp = synth_base.declared_dp(synth, synth_name)  # fails closed: never assumed DP
    if not dp and not ds.allow_non_dp:
        raise ReleaseError(
            f"synthesizer {synth_name!r} is not differentially private; the policy must say "
            f"allow_non_dp: true for dataset {ds.name!r} (its releases are then labelled "
            "privacy: empirical)")
    _check_privacy_options(synth, synth_name, options, ds)
    domain = Domain.from_dataset(ds, columns)
    representation = getattr(synth, "output", "rows") == "representation"
    if representation and (rows is not None or copies != 1):
        raise ConfigurationError(f"{synth_name} releases a table of counts, not rows; drop "
                                 "--rows and --copies")
    previous = provenance.current(store, name)
    existing = _release_tables(store)
    if not replace_ and (previous or name in existing):
        raise ReleaseError(f"a release named {name!r} already exists; choose another name or "
                           "pass --replace (the old provenance is kept, marked superseded)")
    own = _own_tables(previous)
    if name in existing and name not in own:  # a product of another release, --replace or not
        raise ReleaseError(f"{existing[name]}.{name} belongs to another release; choose "
                           "another name for this release")
    for suffix in getattr(synth, "product_suffixes", ()):
        product = f"{name}_{suffix}"
        if product not in own and (product in existing or provenance.current(store, product)):
            raise ReleaseError(f"{synth_name} also writes released.{product}, which another "
                               "release holds; choose another name for this release")
    warnings: list[str] = []
    if dp:
        cost = ctx.cost(epsilon=epsilon, delta=delta, rho=rho)
    else:
        cost = PrivacyCost.zero(policy.accounting)
        if epsilon is not None or rho is not None:
            warnings.append(f"{synth_name} is not DP: the budget given was ignored and nothing "
                            "was charged; the release is labelled privacy: empirical")
    if ds.legacy_public_count:
        warnings.append(f"the policy in force says public_row_count: true for {ds.name!r}, "
                        "which dpsql no longer honours (it published an exact count); the "
                        "row count was estimated with noise. Declare the public number "
                        "(public_row_count: N) and run dpsql policy apply")
    check = getattr(synth, "check", None)
    if callable(check):
        check(domain, cost)
    chosen_seed = int(seed) if seed is not None else secrets.randbits(63)
    return _Plan(ds, synth, synth_name, options, domain, cost, dp, rows, copies, name,
                 chosen_seed, "user" if seed is not None else "generated", previous, warnings,
                 statement, types)


def _source_types(store: Store, ds: Dataset) -> dict[str, str]:
    """The column types of ``ds``'s table; for one on another engine, asked of it now.

    Before the charge: an engine that is down refuses the release at no cost.
    """
    try:
        return dataset_columns(store, ds)
    except PolicyError as err:
        raise ReleaseError(f"the table of dataset {ds.name!r} cannot be read ({err}); "
                           "nothing was charged") from None


def _check_count(value: Any, what: str, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigurationError(f"{what} must be a positive integer, got {value!r}")


def _check_privacy_options(synth: Any, synth_name: str, options: dict[str, Any],
                           ds: Dataset) -> None:
    """Refuse privacy-lowering options set away from their default unless the policy allows."""
    import dataclasses

    lowering = getattr(synth, "privacy_lowering_options", ())
    defaults = {}
    if dataclasses.is_dataclass(synth):
        defaults = {f.name: f.default for f in dataclasses.fields(synth)
                    if f.default is not dataclasses.MISSING}
    for option in lowering:
        if option not in options:
            continue
        value = getattr(synth, option, options[option])
        if option in defaults and value == defaults[option]:
            continue
        if option not in ds.allow_options:
            raise ReleaseError(
                f"option {option!r} of {synth_name} lowers privacy; the policy must list it "
                f"under datasets.{ds.name}.allow_options to use it")


def _own_tables(entry: dict[str, Any] | None) -> set[str]:
    """The table names (unqualified) of a live release row: its table and its products."""
    if entry is None:
        return set()
    record = entry["record"]
    return {t.rpartition(".")[2] for t in [record["table"], *record.get("products", [])]}


def _release_tables(store: Store, cur: duckdb.DuckDBPyConnection | None = None
                    ) -> dict[str, str]:
    """Each table of a release, published or held: name -> its schema."""
    rows = (cur or store.cursor()).execute(
        "SELECT table_name, table_schema FROM information_schema.tables "
        "WHERE table_schema IN ('released', ?)", [provenance.HELD]).fetchall()
    return {str(name): str(schema) for name, schema in rows}


def _statement(dataset: str, synth: str, name: str, epsilon: Any, delta: Any, rho: Any,
               rows: Any, copies: Any, columns: Any, seed: Any, options: dict[str, Any]) -> str:
    parts = [f"release {dataset} --synth {synth} --name {name}"]
    for flag, value in (("epsilon", epsilon), ("delta", delta), ("rho", rho), ("rows", rows),
                        ("seed", seed)):
        if value is not None:
            parts.append(f"--{flag} {value}")
    if copies != 1:
        parts.append(f"--copies {copies}")
    if columns:
        parts.append("--columns " + ",".join(columns))
    parts += [f"--option {k}={v}" for k, v in options.items()]
    return " ".join(parts)


# -- fit, sample, write -------------------------------------------------------------------------


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


def _write_fresh(ctx: Context, plan: _Plan, audit_id: int, result: Synthetic,
                 report: Progress) -> Release:
    """Check the worker's results against the plan, then write them in one transaction."""
    spent = result.spent.to(ctx.policy.accounting)
    if plan.dp and not spent <= plan.cost:
        raise InternalError(f"{plan.synth_name} reports spending {spent} of a budget of "
                            f"{plan.cost}; this is a bug in the synthesizer")
    if not set(result.products) <= set(getattr(plan.synth, "product_suffixes", ())):
        raise InternalError(f"{plan.synth_name} wrote products it did not declare; this is a "
                            "bug in dpsql")
    failed = synth_base.failed_checks(result.description)
    schema = provenance.HELD if failed else "released"
    if "checks" in result.description.get("diagnostics", {}):
        result.description["diagnostics"]["converged"] = not failed
    product_names = [f"{schema}.{plan.name}_{check_identifier(s, 'product suffix')}"
                     for s in result.products]
    record = _record(ctx, plan, audit_id, spent, result.description, result.rows,
                     result.copies, result.output, product_names, result.state is not None,
                     schema)
    report("write", 0, 1)
    _write(ctx.store, plan, record, result.table, result.products, result.state)
    report("write", 1, 1)
    reported = plan.warnings + list(result.description.get("diagnostics", {})
                                    .get("warnings", []))
    held = ""
    if failed:
        held = ("unpublished: the fit failed " + "; ".join(
            f"{c['check']} ({c['value']}, limit {c['limit']})" for c in failed))
        reported.append(f"NOT PUBLISHED: {record['table']} is kept from analysts because the "
                        f"fit failed its diagnostics ({held.partition(': ')[2]}); read "
                        f"'dpsql releases show {plan.name}', then release again (other "
                        f"options, a larger epsilon, coarser bins) or publish it anyway with "
                        f"'dpsql releases publish {plan.name}'")
    return Release(plan.name, record["release_id"], record, reported, held)


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


def _record(ctx: Context, plan: _Plan, audit_id: int, spent: PrivacyCost,
            description: dict[str, Any], rows: int, copies: int, output: str,
            products: list[str], resumable: bool, schema: str) -> dict[str, Any]:
    policy, ds = ctx.policy, plan.dataset
    delta = policy.delta
    module = type(plan.synth).__module__
    known = {"parameters", "measurements", "diagnostics", "within_bin_shapes"}
    return provenance.jsonable({
        "format": provenance.FORMAT,
        "release_id": uuid.uuid4().hex[:16],
        "name": plan.name,
        "table": f"{schema}.{plan.name}",
        "published": schema == "released",
        "dataset": {"name": ds.name, "table": ds.table,
                    "fingerprint": provenance.dataset_fingerprint(
                        policy, ds.name, plan.types),
                    "privacy_unit": ds.privacy_unit or "row", "max_rows": ds.max_rows},
        "policy_fingerprint": policy.fingerprint,
        "synthesizer": {"name": plan.synth_name, "module": module,
                        "version": str(getattr(plan.synth, "version", __version__)),
                        "options": plan.options},
        "parameters": description.get("parameters", {}),
        "seed": {"value": plan.seed, "source": plan.seed_source},
        "privacy": "dp" if plan.dp else "empirical",
        "accounting": policy.accounting,
        "cost": {"charged": plan.cost.as_dict(delta), "spent": spent.as_dict(delta)},
        "measurements": description.get("measurements", []),
        **({"within_bin_shapes": description["within_bin_shapes"]}
           if "within_bin_shapes" in description else {}),
        "diagnostics": description.get("diagnostics", {}),
        "model": {k: v for k, v in description.items() if k not in known},
        "columns": list(plan.domain.names),
        "domain": plan.domain.describe(),
        "output": output,
        "rows": rows,
        "copies": copies,
        "total_rows": rows * copies,
        "products": products,
        "resumable": resumable,
        "released_by": ctx.user,
        "released_at": now().isoformat(),
        "audit_id": audit_id,
        "dpsql_version": __version__,
        "extensions": [],
    })


def _write(store: Store, plan: _Plan, record: dict[str, Any], table: pa.Table,
           extra: Mapping[str, pa.Table], state: str | None) -> None:
    """Table, products, provenance, comment and state in one transaction.

    The tables go in the schema the record names: ``released``, or ``held`` for a
    fit that failed its diagnostics. A superseded release's tables go from either.
    """
    name = plan.name
    schema = record["table"].partition(".")[0]
    with store.lock, store.transaction() as cur:
        previous = provenance.current(store, name, cur)
        if previous and previous["release_id"] != (plan.previous or {}).get("release_id"):
            raise ReleaseError(f"another release named {name!r} was written meanwhile; nothing "
                               "was written")
        if previous:
            for old in [previous["record"]["table"], *previous["record"].get("products", [])]:
                cur.execute(f"DROP TABLE IF EXISTS {_qualified(old)}")
            provenance.supersede(cur, previous["release_id"], record["release_id"])
        tables = [(name, table), *((f"{name}_{s}", t) for s, t in extra.items())]
        existing = _release_tables(store, cur)
        own = _own_tables(previous)
        for table_name, data in tables:
            if table_name in existing:
                if table_name not in own:  # a name another release took meanwhile
                    raise ReleaseError(f"{existing[table_name]}.{table_name} belongs to another "
                                       "release; nothing was written")
                cur.execute(f"DROP TABLE {existing[table_name]}.{quote(table_name)}")
            _create(cur, f"{schema}.{quote(table_name)}", data, record)
        provenance.insert(cur, record)
        if state is not None:
            provenance.keep_state(cur, record["release_id"], plan.synth_name, state)


def _qualified(table: str) -> str:
    """``schema.name`` of a record's table, quoted (the schema is one dpsql wrote)."""
    schema, _, name = table.rpartition(".")
    if schema not in ("released", provenance.HELD):
        raise InternalError(f"a release table outside released and held: {table!r}")
    return f"{schema}.{quote(name)}"


def _create(cur: duckdb.DuckDBPyConnection, table: str, data: pa.Table,
            record: dict[str, Any]) -> None:
    """Create ``table`` (qualified and quoted) from ``data`` with the record as its comment."""
    _from_arrow(cur, data, f"CREATE TABLE {table} AS SELECT * FROM {{}}")
    _comment(cur, table, record)


def _from_arrow(cur: duckdb.DuckDBPyConnection, data: pa.Table, sql: str) -> None:
    """Run ``sql`` with ``{}`` naming a temporary view of ``data``."""
    view = f"_dpsql_arrow_{uuid.uuid4().hex[:8]}"
    cur.register(view, data)
    try:
        cur.execute(sql.format(view))
    finally:
        cur.unregister(view)


def _comment(cur: duckdb.DuckDBPyConnection, table: str, record: dict[str, Any]) -> None:
    cur.execute(f"COMMENT ON TABLE {table} IS "
                f"{provenance.sql_string(provenance.comment(record))}")


# -- more copies from a stored state ----------------------------------------------------------


def _prepare_more(ctx: Context, request: MoreRequest, start: Start | None) -> Charged:
    """Check a release-more request and audit it (sampling from a DP state costs nothing)."""
    ctx.require_admin("release synthetic data")
    _check_count(request.copies, "copies")
    store, name = ctx.store, request.name
    entry = provenance.find(store, name)
    record = entry["record"]
    synth_name = record["synthesizer"]["name"]
    state = provenance.stored_state(store, entry["release_id"])
    if not record.get("resumable") or state is None:
        raise ReleaseError(f"release {name!r} ({synth_name}) kept no state to sample from; "
                           "release again with more --copies instead")
    synth = synth_base.get(synth_name, **record["synthesizer"]["options"])
    if not callable(getattr(synth, "restore", None)):
        raise ReleaseError(f"synthesizer {synth_name!r} cannot restore a stored state; release "
                           "again with more --copies instead")
    seed = request.seed
    chosen = int(seed) if seed is not None else secrets.randbits(63)
    statement = f"release-more {name} --copies {request.copies}" + (
        f" --seed {seed}" if seed is not None else "")
    dataset = record["dataset"]["name"]
    first = int(record["copies"]) + 1
    numbers = list(range(first, first + request.copies))
    args = (synth, state, provenance.domain_of(store, record), int(record["rows"]), numbers,
            chosen)
    if start is not None:
        start(sample_more, args)
    audit_id = ctx.ledger.record(ctx.user, dataset, statement, Outcome.STARTED,
                                 "sampling from the stored DP state: no cost",
                                 cost=PrivacyCost.zero(ctx.policy.accounting), action="release")
    extension = {"copies": numbers,
                 "seed": {"value": chosen, "source": "generated" if seed is None else "user"},
                 "by": ctx.user, "at": now().isoformat(timespec="seconds"),
                 "audit_id": audit_id}
    return Charged("release_more", name, dataset, synth_name, audit_id, "", sample_more, args,
                   entry={**entry, "extension": extension})


def sample_more(folder: Path, synth: Any, state: str, domain: Domain, rows: int,
                numbers: list[int], seed: int, *, report: Progress) -> None:
    """In the worker: restore the stored DP state and sample copies ``numbers`` into ``folder``."""
    fitted = synth.restore(json.loads(state), domain)
    table = sample_copies(fitted, domain, rows, numbers, np.random.default_rng(seed),
                          with_copy_column=True, report=report)
    Synthetic(table, {}, {}, None, PrivacyCost.zero("zcdp"), rows, len(numbers),
              "rows").save(folder)


def _write_more(ctx: Context, charged: Charged, result: Synthetic, report: Progress) -> Release:
    """Append the sampled copies and the extended provenance in one transaction."""
    assert charged.entry is not None
    entry = {k: v for k, v in charged.entry.items() if k != "extension"}
    extension, record = charged.entry["extension"], entry["record"]
    copies = int(record["copies"]) + len(extension["copies"])
    record = {**record, "copies": copies, "total_rows": record["rows"] * copies,
              "extensions": [*record.get("extensions", []), extension]}
    report("write", 0, 1)
    _append(ctx.store, entry, record, result.table)
    report("write", 1, 1)
    held = "" if record.get("published", True) else \
        "unpublished: more copies of a release held since its fit failed its diagnostics"
    return Release(charged.name, record["release_id"], record, [], held)


def _append(store: Store, entry: dict[str, Any], record: dict[str, Any],
            table: pa.Table) -> None:
    """Add copies and the updated provenance in one transaction (refused if changed meanwhile)."""
    name = record["name"]
    with store.lock, store.transaction() as cur:
        now_live = provenance.current(store, name, cur)
        if now_live is None or now_live["record"] != entry["record"]:
            raise ReleaseError(f"release {name!r} changed meanwhile; nothing was written, "
                               "run release-more again")
        schema, target = record["table"].partition(".")[0], _qualified(record["table"])
        if COPY_COLUMN not in table_columns(store, name, schema):
            cur.execute(f"ALTER TABLE {target} ADD COLUMN {COPY_COLUMN} INTEGER DEFAULT 1")
        _from_arrow(cur, table, f"INSERT INTO {target} BY NAME SELECT * FROM {{}}")
        _comment(cur, target, record)
        provenance.update(cur, record)


# -- publishing a held release ----------------------------------------------------------------
def publish(ctx: Context, name: str) -> Release:
    """Publish release ``name``, held because its fit failed its diagnostics (admins only).

    The administrator's explicit say-so that the table may reach analysts: its
    tables move from ``held`` to ``released`` in one transaction, and the record
    keeps the failed checks and says who published it, and when. Audited, a
    refusal too; a failure writes nothing.
    """
    statement = f"releases publish {name}"
    try:
        ctx.require_admin("publish a release")
        record = _publish(ctx, name)
    except (DPSQLError, duckdb.Error) as err:
        ctx.ledger.record(ctx.user, None, statement, Outcome.REFUSED, str(err).splitlines()[0],
                          action="publish")
        if isinstance(err, DPSQLError):
            raise
        raise ReleaseError(f"release {name!r} could not be published (its tables changed); "
                           "nothing was published") from err
    failed = synth_base.failed_checks(record)
    ctx.ledger.record(ctx.user, record["dataset"]["name"], statement, Outcome.PUBLISHED,
                      "published despite failed diagnostics: " + ", ".join(
                          c["check"] for c in failed), action="publish")
    return Release(name, record["release_id"], record)


def _publish(ctx: Context, name: str) -> dict[str, Any]:
    """Move a held release's tables to ``released`` in one transaction; its new record."""
    entry = provenance.find(ctx.store, name)
    record = entry["record"]
    if record.get("published", True):
        raise ReleaseError(f"release {name!r} is published already")
    held = [record["table"], *record.get("products", [])]
    moved = [f"released.{t.rpartition('.')[2]}" for t in held]
    published = {**record, "table": moved[0], "products": moved[1:], "published": True,
                 "published_by": ctx.user, "published_at": now().isoformat(timespec="seconds")}
    with ctx.store.lock, ctx.store.transaction() as cur:
        now_live = provenance.current(ctx.store, name, cur)
        if now_live is None or now_live["record"] != record:
            raise ReleaseError(f"release {name!r} changed meanwhile; nothing was published")
        published_names = {r[0] for r in cur.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'released'"
        ).fetchall()}
        taken = [t for t in moved if t.rpartition(".")[2] in published_names]
        if taken:
            raise ReleaseError(f"{', '.join(taken)} belongs to another release; nothing was "
                               "published")
        for old, new in zip(held, moved, strict=True):
            cur.execute(f"CREATE TABLE {_qualified(new)} AS SELECT * FROM {_qualified(old)}")
            cur.execute(f"DROP TABLE {_qualified(old)}")
            _comment(cur, _qualified(new), published)
        provenance.update(cur, published)
    return published
