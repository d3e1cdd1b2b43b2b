"""Writing a release: the worker's results checked and written in one transaction, and publishing.

A fit whose checks all pass goes to ``released``; one that fails a check its
synthesizer declares goes to ``held``, where no analyst reads it, until
:func:`publish` (see docs/releases.md, "Fits that fail their diagnostics").
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from dpsql import provenance
from dpsql.domain import Domain, quote
from dpsql.errors import (
    DPSQLError,
    InternalError,
    ReleaseError,
)
from dpsql.imports import table_columns
from dpsql.outcomes import Outcome
from dpsql.policy import Dataset
from dpsql.privacy import PrivacyCost
from dpsql.progress import Progress
from dpsql.release.fit import COPY_COLUMN, FitSpec, Synthetic
from dpsql.store import Store, check_identifier, now
from dpsql.synth import base as synth_base
from dpsql.synth.forecast import Forecast
from dpsql.version import __version__

if TYPE_CHECKING:
    from dpsql.context import Context


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
class Plan:
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
    forecast: Forecast  # the noise its measurements will carry (public arithmetic)
    forecast_record: dict[str, Any]  # the same, rendered as the provenance keeps it

    def fit_spec(self) -> FitSpec:
        """What the worker needs to fit and sample (no policy objects: those stay here)."""
        return FitSpec(self.synth, self.synth_name, self.domain, self.cost, self.seed, self.rows,
                       self.copies)


def own_tables(entry: dict[str, Any] | None) -> set[str]:
    """The table names (unqualified) of a live release row: its table and its products."""
    if entry is None:
        return set()
    record = entry["record"]
    return {t.rpartition(".")[2] for t in [record["table"], *record.get("products", [])]}


def release_tables(store: Store, cur: duckdb.DuckDBPyConnection | None = None
                    ) -> dict[str, str]:
    """Each table of a release, published or held: name -> its schema."""
    rows = (cur or store.cursor()).execute(
        "SELECT table_name, table_schema FROM information_schema.tables "
        "WHERE table_schema IN ('released', ?)", [provenance.HELD]).fetchall()
    return {str(name): str(schema) for name, schema in rows}


def write_fresh(ctx: Context, plan: Plan, audit_id: int, result: Synthetic,
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


def _record(ctx: Context, plan: Plan, audit_id: int, spent: PrivacyCost,
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
        "forecast": plan.forecast_record,
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


def _write(store: Store, plan: Plan, record: dict[str, Any], table: pa.Table,
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
        existing = release_tables(store, cur)
        own = own_tables(previous)
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


def write_more(ctx: Context, name: str, extended: dict[str, Any], result: Synthetic,
               report: Progress) -> Release:
    """Append the sampled copies and the extended provenance in one transaction.

    ``extended``: the live release row the copies extend, with the ``extension``
    (copy numbers, seed, who, when) to record.
    """
    entry = {k: v for k, v in extended.items() if k != "extension"}
    extension, record = extended["extension"], entry["record"]
    copies = int(record["copies"]) + len(extension["copies"])
    record = {**record, "copies": copies, "total_rows": record["rows"] * copies,
              "extensions": [*record.get("extensions", []), extension]}
    report("write", 0, 1)
    _append(ctx.store, entry, record, result.table)
    report("write", 1, 1)
    held = "" if record.get("published", True) else \
        "unpublished: more copies of a release held since its fit failed its diagnostics"
    return Release(name, record["release_id"], record, [], held)


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
