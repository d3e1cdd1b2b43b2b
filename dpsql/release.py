"""Synthetic releases: check, charge, fit, sample, decode, then write atomically.

The flow of :func:`release`:

1. checks that need nothing private (role, name, policy, synthesizer, options,
   columns, budget arithmetic, the synthesizer's own public ``check``); a
   refusal here is audited and costs nothing;
2. the ledger charges the budget (DP synthesizers only) and commits;
3. the synthesizer fits on the bounded source and samples; the domain decodes;
4. one DuckDB transaction writes ``released.<name>``, any extra DP products,
   the provenance row (also the table COMMENT) and the resumable state.

A failure after the charge leaves the charge (budget is never refunded) and
nothing else. Non-DP synthesizers need ``allow_non_dp: true`` in the policy,
are labelled ``privacy: empirical`` and spend no budget, but are audited.
"""

from __future__ import annotations

import json
import secrets
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa

from dpsql import __version__, provenance
from dpsql.domain import Domain, quote
from dpsql.errors import ConfigurationError, DPSQLError, InternalError, ReleaseError
from dpsql.policy import Dataset
from dpsql.privacy import Number, PrivacyCost
from dpsql.progress import Progress, silent
from dpsql.source import bounded_relation
from dpsql.store import Store, check_identifier, now
from dpsql.synth import base as synth_base

if TYPE_CHECKING:
    from dpsql.session import Session

COPY_COLUMN = "_copy"


@dataclass(frozen=True)
class Release:
    """A written release: its table name, provenance record and warnings to show."""

    name: str
    release_id: str
    record: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def table(self) -> str:
        """The qualified table name, ``released.<name>``."""
        return f"released.{self.name}"


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


def release(session: Session, dataset: str, synthesizer: str, *, name: str,
            epsilon: Number | None = None, delta: Number | None = None,
            rho: Number | None = None, rows: int | None = None, copies: int = 1,
            columns: Sequence[str] | None = None, seed: int | None = None,
            replace: bool = False, progress: Progress | None = None,
            options: Mapping[str, Any] | None = None) -> Release:
    """Release a synthetic table ``released.<name>`` of ``dataset`` (admins only)."""
    opts = dict(options or {})
    statement = _statement(dataset, synthesizer, name, epsilon, delta, rho, rows, copies,
                           columns, seed, opts)
    ledger = session.ledger
    dataset_for_audit = dataset if dataset in session.policy.datasets else None
    try:
        session.require_admin("release synthetic data")
        plan = _plan(session, dataset, synthesizer, name, epsilon, delta, rho, rows, copies,
                     columns, seed, replace, opts, statement)
    except DPSQLError as err:
        ledger.record(session.user, dataset_for_audit, statement, "refused", str(err),
                      action="release")
        raise
    if plan.dp:
        charge = ledger.charge(session.user, dataset, plan.cost, statement, action="release")
        audit_id = charge.id
    else:
        audit_id = ledger.record(session.user, dataset, statement, "started",
                                 "not DP: labelled privacy: empirical, no budget spent",
                                 cost=PrivacyCost.zero(session.policy.accounting),
                                 action="release")
    try:
        result = _run(session, plan, audit_id, progress or silent)
    except BaseException as err:
        kept = f"; the charge of {plan.cost.describe(session.policy.delta)} stays" \
            if plan.dp else ""
        ledger.settle(audit_id, "failed", f"{type(err).__name__}{kept}")
        if isinstance(err, DPSQLError) or not isinstance(err, Exception):
            raise
        raise ReleaseError(
            f"the release failed ({type(err).__name__}); nothing was written{kept} (budget "
            "is never refunded); set DPSQL_DEBUG=1 for details"
        ) from err
    ledger.settle(audit_id, "released")
    return result


# -- planning (public information only) -------------------------------------------------


def _plan(session: Session, dataset_name: str, synth_name: str, name: str,
          epsilon: Number | None, delta: Number | None, rho: Number | None, rows: int | None,
          copies: int, columns: Sequence[str] | None, seed: int | None, replace_: bool,
          options: dict[str, Any], statement: str) -> _Plan:
    store, policy = session.store, session.policy
    check_identifier(name, "release name")
    _check_count(rows, "rows", allow_none=True)
    _check_count(copies, "copies")
    if seed is not None and (not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ConfigurationError(f"seed must be a non-negative integer, got {seed!r}")
    ds = policy.dataset(dataset_name)
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
    existing = _released_tables(store)
    if not replace_ and (previous or name in existing):
        raise ReleaseError(f"a release named {name!r} already exists; choose another name or "
                           "pass --replace (the old provenance is kept, marked superseded)")
    own = set() if previous is None else {
        t.rpartition(".")[2] for t in [previous["record"]["table"],
                                       *previous["record"].get("products", [])]}
    for suffix in getattr(synth, "product_suffixes", ()):
        product = f"{name}_{suffix}"
        if product not in own and (product in existing or provenance.current(store, product)):
            raise ReleaseError(f"{synth_name} also writes released.{product}, which another "
                               "release holds; choose another name for this release")
    warnings: list[str] = []
    if dp:
        cost = session.cost(epsilon=epsilon, delta=delta, rho=rho)
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
                 statement)


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


def _released_tables(store: Store, cur: duckdb.DuckDBPyConnection | None = None) -> set[str]:
    rows = (cur or store.cursor()).execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'released'"
    ).fetchall()
    return {r[0] for r in rows}


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


def _run(session: Session, plan: _Plan, audit_id: int, report: Progress) -> Release:
    store, policy = session.store, session.policy
    rng = np.random.default_rng(plan.seed)
    source = bounded_relation(store, plan.dataset)
    report("fit", 0, None)
    with warnings.catch_warnings():  # reported in the release's own warnings instead
        warnings.simplefilter("ignore", synth_base.SynthesizerWarning)
        fitted = plan.synth.fit(source, plan.domain, plan.cost, rng, report)
    spent = fitted.spent.to(policy.accounting)
    if plan.dp and not spent <= plan.cost:
        raise InternalError(f"{plan.synth_name} reports spending {spent} of a budget of "
                            f"{plan.cost}; this is a bug in the synthesizer")
    representation = callable(getattr(fitted, "representation", None))
    if representation:
        table = fitted.representation()
        rows, copies = table.num_rows, 1
    else:
        rows = plan.rows if plan.rows is not None else int(fitted.rows)
        if rows <= 0:
            raise ReleaseError(f"{plan.synth_name} estimated {rows} rows; pass --rows N")
        copies = plan.copies
        table = sample_copies(fitted, plan.domain, rows, range(1, copies + 1), rng,
                              with_copy_column=copies > 1, report=report)
    description = dict(fitted.describe())  # after sampling: its diagnostics are included
    products = getattr(fitted, "products", None)
    extra: Mapping[str, pa.Table] = products() if callable(products) else {}
    if not set(extra) <= set(getattr(plan.synth, "product_suffixes", ())):
        raise InternalError(f"{plan.synth_name} wrote products it did not declare; this is a "
                            "bug in dpsql")
    product_names = [f"released.{plan.name}_{check_identifier(s, 'product suffix')}"
                     for s in extra]
    state = fitted.state() if callable(getattr(fitted, "state", None)) else None
    record = _record(session, plan, audit_id, fitted, spent, description, rows, copies,
                     "representation" if representation else "rows", product_names,
                     state is not None)
    report("write", 0, 1)
    _write(store, plan, record, table, extra, state)
    report("write", 1, 1)
    reported = plan.warnings + list(description.get("diagnostics", {}).get("warnings", []))
    return Release(plan.name, record["release_id"], record, reported)


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


def _record(session: Session, plan: _Plan, audit_id: int, fitted: Any, spent: PrivacyCost,
            description: dict[str, Any], rows: int, copies: int, output: str,
            products: list[str], resumable: bool) -> dict[str, Any]:
    policy, store, ds = session.policy, session.store, plan.dataset
    delta = policy.delta
    module = type(plan.synth).__module__
    known = {"parameters", "measurements", "diagnostics"}
    return provenance.jsonable({
        "format": provenance.FORMAT,
        "release_id": uuid.uuid4().hex[:16],
        "name": plan.name,
        "table": f"released.{plan.name}",
        "dataset": {"name": ds.name, "table": ds.table,
                    "fingerprint": provenance.dataset_fingerprint(
                        policy, ds.name, store.table_columns(ds.table)),
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
        "released_by": session.user,
        "released_at": now().isoformat(),
        "audit_id": audit_id,
        "dpsql_version": __version__,
        "extensions": [],
    })


def _write(store: Store, plan: _Plan, record: dict[str, Any], table: pa.Table,
           extra: Mapping[str, pa.Table], state: dict[str, Any] | None) -> None:
    """Table, products, provenance, comment and state in one transaction."""
    name = plan.name
    with store.lock, store.transaction() as cur:
        previous = provenance.current(store, name, cur)
        if previous and previous["release_id"] != (plan.previous or {}).get("release_id"):
            raise ReleaseError(f"another release named {name!r} was written meanwhile; nothing "
                               "was written")
        if previous:
            for old in [previous["record"]["table"], *previous["record"].get("products", [])]:
                cur.execute(f"DROP TABLE IF EXISTS released.{quote(old.rpartition('.')[2])}")
            provenance.supersede(cur, previous["release_id"], record["release_id"])
            cur.execute("DELETE FROM dpsql.release_states WHERE release_id = ?",
                        [previous["release_id"]])
        tables = [(name, table), *((f"{name}_{s}", t) for s, t in extra.items())]
        existing = _released_tables(store, cur)
        for table_name, data in tables:
            if table_name in existing:
                if table_name != name:  # a product name another release took meanwhile
                    raise ReleaseError(f"released.{table_name} belongs to another release; "
                                       "nothing was written")
                cur.execute(f"DROP TABLE released.{quote(table_name)}")
            _create(cur, table_name, data, record)
        provenance.insert(cur, record)
        if state is not None:
            cur.execute("INSERT INTO dpsql.release_states VALUES (?, ?, ?, ?)",
                        [record["release_id"], plan.synth_name, provenance.to_json(state),
                         now()])


def _create(cur: duckdb.DuckDBPyConnection, table_name: str, data: pa.Table,
            record: dict[str, Any]) -> None:
    _from_arrow(cur, data, f"CREATE TABLE released.{quote(table_name)} AS SELECT * FROM {{}}")
    _comment(cur, table_name, record)


def _from_arrow(cur: duckdb.DuckDBPyConnection, data: pa.Table, sql: str) -> None:
    """Run ``sql`` with ``{}`` naming a temporary view of ``data``."""
    view = f"_dpsql_arrow_{uuid.uuid4().hex[:8]}"
    cur.register(view, data)
    try:
        cur.execute(sql.format(view))
    finally:
        cur.unregister(view)


def _comment(cur: duckdb.DuckDBPyConnection, table_name: str, record: dict[str, Any]) -> None:
    cur.execute(f"COMMENT ON TABLE released.{quote(table_name)} IS "
                f"{provenance.sql_string(provenance.comment(record))}")


# -- more copies from a stored state ----------------------------------------------------------


def release_more(session: Session, name: str, copies: int, *, seed: int | None = None,
                 progress: Progress | None = None) -> Release:
    """Append ``copies`` more synthetic copies to a resumable release, at no privacy cost.

    Sampling from the stored DP state is post-processing; the release's
    provenance records each extension. Audited like a release (zero cost).
    """
    session.require_admin("release synthetic data")
    _check_count(copies, "copies")
    store, report = session.store, progress or silent
    entry = provenance.find(store, name)
    record = entry["record"]
    synth_name = record["synthesizer"]["name"]
    row = store.cursor().execute("SELECT state FROM dpsql.release_states WHERE release_id = ?",
                                 [entry["release_id"]]).fetchone()
    if not record.get("resumable") or row is None:
        raise ReleaseError(f"release {name!r} ({synth_name}) kept no state to sample from; "
                           "release again with more --copies instead")
    synth = synth_base.get(synth_name, **record["synthesizer"]["options"])
    restore = getattr(synth, "restore", None)
    if not callable(restore):
        raise ReleaseError(f"synthesizer {synth_name!r} cannot restore a stored state; release "
                           "again with more --copies instead")
    chosen = int(seed) if seed is not None else secrets.randbits(63)
    statement = f"release-more {name} --copies {copies}" + (
        f" --seed {seed}" if seed is not None else "")
    audit_id = session.ledger.record(session.user, record["dataset"]["name"], statement,
                                     "started", "sampling from the stored DP state: no cost",
                                     cost=PrivacyCost.zero(session.policy.accounting),
                                     action="release")
    try:
        domain = provenance.domain_of(store, record)
        fitted = restore(json.loads(row[0]), domain)
        first = int(record["copies"]) + 1
        numbers = list(range(first, first + copies))
        table = sample_copies(fitted, domain, int(record["rows"]), numbers,
                              np.random.default_rng(chosen), with_copy_column=True,
                              report=report)
        record = {**record, "copies": first - 1 + copies,
                  "total_rows": record["rows"] * (first - 1 + copies),
                  "extensions": [*record.get("extensions", []), {
                      "copies": numbers,
                      "seed": {"value": chosen,
                               "source": "generated" if seed is None else "user"},
                      "by": session.user, "at": now().isoformat(timespec="seconds"),
                      "audit_id": audit_id}]}
        report("write", 0, 1)
        _append(store, entry, record, table)
        report("write", 1, 1)
    except BaseException as err:
        session.ledger.settle(audit_id, "failed", type(err).__name__)
        raise
    session.ledger.settle(audit_id, "released")
    return Release(name, record["release_id"], record)


def _append(store: Store, entry: dict[str, Any], record: dict[str, Any],
            table: pa.Table) -> None:
    """Add copies and the updated provenance in one transaction (refused if changed meanwhile)."""
    name = record["name"]
    with store.lock, store.transaction() as cur:
        now_live = provenance.current(store, name, cur)
        if now_live is None or now_live["record"] != entry["record"]:
            raise ReleaseError(f"release {name!r} changed meanwhile; nothing was written, "
                               "run release-more again")
        if COPY_COLUMN not in store.table_columns(name, "released"):
            cur.execute(f"ALTER TABLE released.{quote(name)} ADD COLUMN {COPY_COLUMN} "
                        "INTEGER DEFAULT 1")
        _from_arrow(cur, table, f"INSERT INTO released.{quote(name)} BY NAME SELECT * FROM {{}}")
        _comment(cur, name, record)
        provenance.update(cur, record)
