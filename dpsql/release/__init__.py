"""Synthetic releases in three phases: prepare (owner), fit and sample (worker), write (owner).

1. :func:`prepare`, in the process that owns the store: checks that need nothing
   private (role, name, policy, synthesizer, options, columns, budget
   arithmetic, the synthesizer's own public ``check``; a refusal is audited
   and costs nothing), then the ledger charges the budget (DP synthesizers
   only) and commits. :meth:`Charged.export` then asks the dataset's engine (the store,
   PostgreSQL or Spark) for the bounded source's contingency table over the
   release's domain (distinct rows and their counts) and streams it to a
   private folder (Arrow IPC).
2. :func:`~dpsql.release.fit.synthesize`, in a worker process (see
   :mod:`dpsql.jobs`): fit on that table expanded back to one row per source row
   (lazily, in DuckDB), sample, decode; the results go back to the folder as
   Arrow IPC and JSON.
3. :meth:`Charged.write`, in the owner (:mod:`~dpsql.release.write`): one DuckDB
   transaction checks and writes ``released.<name>`` (``held.<name>`` for a fit
   that failed its diagnostics), any extra DP products, the provenance row (also
   the table COMMENT) and the resumable state.

A failure after the charge leaves the charge (budget is never refunded) and
nothing else. Non-DP synthesizers need ``allow_non_dp: true`` in the policy,
are labelled ``privacy: empirical`` and spend no budget, but are audited.

This module checks, plans and charges; :mod:`~dpsql.release.fit` is what the
worker runs; :mod:`~dpsql.release.write` writes the results and publishes a held
release.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from dpsql import provenance
from dpsql.domain import Domain
from dpsql.engines.interrupt import Interrupter
from dpsql.errors import (
    ConfigurationError,
    DPSQLError,
    PolicyError,
    ReleaseError,
)
from dpsql.outcomes import Outcome
from dpsql.policies import dataset_columns, release_domain
from dpsql.policy import Dataset
from dpsql.privacy import Number, PrivacyCost
from dpsql.progress import Progress
from dpsql.release.fit import (
    SOURCE_FILE,
    Synthetic,
    export_source,
    sample_more,
    synthesize,
)
from dpsql.release.write import Plan, Release, own_tables, release_tables, write_fresh, write_more
from dpsql.store import Store, check_identifier, now
from dpsql.synth import base as synth_base
from dpsql.synth.forecast import Forecast, baseline

if TYPE_CHECKING:
    from dpsql.context import Context


#: Called with a release's work and its arguments once the request is checked, before the charge.
Start = Callable[[Callable[..., None], tuple[Any, ...]], None]


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
    force: bool = False  # release even when the forecast says it cannot beat independent

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
    plan: Plan | None = None  # a fresh release
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
            return write_fresh(ctx, self.plan, self.audit_id, Synthetic.load(folder), report)
        assert self.entry is not None
        return write_more(ctx, self.name, self.entry, Synthetic.load(folder), report)

    def failure(self, name: str) -> tuple[str, ReleaseError]:
        """The audit reason and the error to raise when the work failed with error ``name``."""
        return f"{name}{self.kept}", ReleaseError(
            f"the release failed ({name}); nothing was written{self.kept} (budget is never "
            "refunded); set DPSQL_DEBUG=1 for details")


@dataclass(frozen=True)
class DryRun:
    """What a release would do, checked and forecast, with nothing charged or computed."""

    name: str
    dataset: str
    synthesizer: str
    columns: list[str]
    cells: int  # of the full joint domain of the columns
    dp: bool
    cost: str  # what it would charge, as the policy states budgets
    rows: int | None
    copies: int
    forecast: Forecast
    warnings: list[str]
    refused: str  # why the release itself would be refused ("" when it would run)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able (``dpsql release --dry-run --json``)."""
        return {"name": self.name, "dataset": self.dataset, "synthesizer": self.synthesizer,
                "columns": self.columns, "cells": self.cells, "dp": self.dp,
                "cost": self.cost, "rows": self.rows, "copies": self.copies,
                "forecast": self.forecast.as_dict(), "warnings": self.warnings,
                "refused": self.refused or None}


def dry_run(ctx: Context, request: ReleaseRequest) -> DryRun:
    """Every check a release makes before its charge, and its forecast; nothing is charged.

    Admins only. A check that fails raises as the release would (nothing is
    audited: a dry run reads nothing private); a forecast that would refuse it
    is reported in ``refused``.
    """
    ctx.require_admin("plan a release")
    r = request
    opts = dict(r.options)
    statement = _statement(r.dataset, r.synthesizer, r.name, r.epsilon, r.delta, r.rho, r.rows,
                           r.copies, r.columns, r.seed, opts)
    plan = _plan(ctx, r.dataset, r.synthesizer, r.name, r.epsilon, r.delta, r.rho, r.rows,
                 r.copies, r.columns, r.seed, r.replace, opts, statement)
    refused = "" if r.force or not plan.forecast.worse else \
        "the forecast says it cannot beat independent (below); --force releases it anyway"
    if plan.dp:
        left = ctx.ledger.budget(ctx.user, plan.dataset.name).remaining
        if not plan.cost <= left:
            refused = (f"it costs {plan.cost.describe(ctx.policy.delta)}, more than the "
                       f"{left.describe(ctx.policy.delta, 'down')} {ctx.user} has left on "
                       f"{plan.dataset.name}" + (f"; and {refused}" if refused else ""))
    return DryRun(plan.name, plan.dataset.name, plan.synth_name, list(plan.domain.names),
                  plan.domain.size(), plan.dp, plan.cost.describe(ctx.policy.delta),
                  plan.rows, plan.copies, plan.forecast, list(plan.warnings), refused)


def _forecast_refusal(plan: Plan) -> str:
    """Why the forecast refuses ``plan`` without ``--force`` ("" when it does not)."""
    if not plan.forecast.worse:
        return ""
    return (f"the forecast says {plan.synth_name} cannot beat independent here: "
            f"{plan.forecast.worse}. Nothing was charged; pass --force to release it anyway "
            "(dpsql release --dry-run shows the whole forecast)")


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
                           r.copies, r.columns, r.seed, opts) + (" --force" if r.force else "")
    ledger = ctx.ledger
    dataset_for_audit = r.dataset if r.dataset in ctx.policy.datasets else None
    try:
        ctx.require_admin("release synthetic data")
        plan = _plan(ctx, r.dataset, r.synthesizer, r.name, r.epsilon, r.delta, r.rho, r.rows,
                     r.copies, r.columns, r.seed, r.replace, opts, statement)
        refusal = "" if r.force else _forecast_refusal(plan)
        if refusal:
            raise ReleaseError(refusal)
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


def _plan(ctx: Context, dataset_name: str, synth_name: str, name: str,
          epsilon: Number | None, delta: Number | None, rho: Number | None, rows: int | None,
          copies: int, columns: Sequence[str] | None, seed: int | None, replace_: bool,
          options: dict[str, Any], statement: str) -> Plan:
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
    existing = release_tables(store)
    if not replace_ and (previous or name in existing):
        raise ReleaseError(f"a release named {name!r} already exists; choose another name or "
                           "pass --replace (the old provenance is kept, marked superseded)")
    own = own_tables(previous)
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
    forecast = _forecast(synth, synth_name, domain, cost, dp)
    # Rendered now, before any charge: nothing after it may fail on the forecast.
    recorded = provenance.jsonable(forecast.as_dict())
    chosen_seed = int(seed) if seed is not None else secrets.randbits(63)
    return Plan(ds, synth, synth_name, options, domain, cost, dp, rows, copies, name,
                 chosen_seed, "user" if seed is not None else "generated", previous, warnings,
                 statement, types, forecast, recorded)


def _forecast(synth: Any, synth_name: str, domain: Domain, cost: PrivacyCost,
              dp: bool) -> Forecast:
    """The synthesizer's forecast (public arithmetic), or one that says it declares none.

    A release that is not DP measures nothing with noise: there is nothing to forecast.
    """
    if not dp:
        return Forecast(synth_name, (), domain.public_rows, None, dp=False)
    method = getattr(synth, "forecast", None)
    if callable(method):
        try:
            found = method(domain, cost)
        except DPSQLError:
            raise
        except Exception as err:  # a plugin's bug: refused (and audited), never charged
            raise ConfigurationError(f"synthesizer {synth_name!r} could not forecast its "
                                     f"release ({type(err).__name__}: {err}); nothing was "
                                     "charged") from err
        if not isinstance(found, Forecast):
            raise ConfigurationError(f"synthesizer {synth_name!r} returned a forecast of type "
                                     f"{type(found).__name__}, not a Forecast")
        return found
    return Forecast(synth_name, (), domain.public_rows, baseline(domain, cost),
                    notes=(f"{synth_name} declares no forecast",))


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
    args = (synth, state, release_domain(store, record), int(record["rows"]), numbers,
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
