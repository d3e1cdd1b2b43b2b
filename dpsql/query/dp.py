"""A DP query end to end: plan, price, bind, **charge**, measure, add noise, post-process.

Also EXPLAIN PRIVACY (priced, nothing computed) and what an answer says of each
column (mechanism, scale, interval). See :mod:`dpsql.query.answer` for the
order of the steps and the guarantees around the charge.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
from sqlglot import exp

from dpsql import public
from dpsql.engines.base import EngineError, Prepared
from dpsql.errors import InternalError, QueryCanceled
from dpsql.outcomes import Outcome
from dpsql.policy import Dataset
from dpsql.privacy import PrivacyCost, figure
from dpsql.query import cache, meta
from dpsql.query.call import DEFAULT_CONFIDENCE, Answer, Call
from dpsql.query.dialect import reject
from dpsql.query.model import SPREAD, QueryPlan
from dpsql.query.options import (
    confidence,
    nonnegative_counts,
    query_cost,
    target_error,
)
from dpsql.query.plancache import PLANS, Entry
from dpsql.query.planner import plan_query
from dpsql.query.portable import check_total
from dpsql.query.post import answer_table, answer_types, base_table, check_post
from dpsql.query.quantile import MeasureNoise
from dpsql.query.render import Context as SQLContext
from dpsql.query.render import calibrate, clamped_columns, expand_public_keys, to_sql
from dpsql.query.selection import Selection, released, select_keys, selection_delta
from dpsql.query.statement import (
    QueryStatement,
    classify,
)
from dpsql.query.target import suggest
from dpsql.store import Store

#: The measurements of an aggregate made of several, by name, in the plan's order.
PART_NAMES = {"avg": ("sum", "count"),
              **{f: ("squares", "sum", "count") for f in SPREAD}}


SPLIT_NOTES = {"avg": "noisy sum / noisy count; its error depends on the count",
               **{f: "from the noisy centred sum of squares, centred sum and count, each "
                  "a third of its cost; its error depends on the count" for f in SPREAD}}


#: The one reply to any failure after a charge (engine error, bug) and its audit
#: reason: whether a query fails must not depend on the rows (the SQL is total), and what
#: the analyst reads then does not either. The cause goes to the log only.
FAILED_AFTER_CHARGE = ("the query failed after it was charged, and the charge stands; this "
                       "is a bug in dpsql, please report it with your query")


FAILED_REASON = "the generated query did not complete; the charge stands"


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Prepared:
    entry: Entry
    cost: PrivacyCost
    noises: tuple[MeasureNoise, ...]
    key: str
    sql: SQLContext
    selection: Selection | None = None

    @property
    def plan(self) -> QueryPlan:
        return self.entry.plan


def planned(call: Call, ast: exp.Expr, text: str) -> Entry:
    """Validate a DP query into a plan and keep it for the next time ``text`` arrives."""
    types: dict[str, dict[str, str]] = {}

    def types_of(dataset: Dataset) -> dict[str, str]:
        if dataset.table not in types:
            types[dataset.table] = _column_types(call, dataset)
        return types[dataset.table]

    plan = plan_query(ast, text, call.policy, types_of, _Catalog(call.ctx.store))
    if not plan.measures:
        raise reject(text, "a DP query needs at least one aggregate", ast,
                     construct="SELECT", advice="add COUNT(*), SUM(col) or AVG(col)")
    entry = Entry(plan, types_of(plan.dataset))
    call.ctx.store[PLANS].put(call.user, text, call.policy.fingerprint, entry)
    return entry


def reused(call: Call, text: str) -> Entry | None:
    """The plan of the user's ``text`` made under this policy, if kept.

    Its table's column types are compared with the plan's in the statement's
    snapshot before it is used (:func:`answer_dp`).
    """
    return call.ctx.store[PLANS].get(call.user, text, call.policy.fingerprint)


def _again(call: Call, text: str) -> Answer:
    """Forget the stale kept plan of ``text``, plan the text anew and answer it."""
    call.ctx.store[PLANS].drop(call.user, text, call.policy.fingerprint)
    statement = classify(text)
    assert isinstance(statement, QueryStatement)  # it was planned as a DP query before
    return answer_dp(call, planned(call, statement.ast, text), text, checked=True)


def _same_types(call: Call, dataset: Dataset, types: Mapping[str, str]) -> bool:
    """Whether ``dataset``'s table still has ``types`` (a table that cannot be read has not)."""
    try:
        return _column_types(call, dataset) == types
    except InternalError:
        return False


class _Catalog:
    """The store's public tables, for the planner (public data: reading them costs nothing)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def types(self, table: str) -> dict[str, str]:
        with contextlib.closing(self.store.cursor()) as cur:
            return public.column_types(cur, table)

    def values(self, table: str, column: str) -> tuple[Any, ...]:
        with contextlib.closing(self.store.cursor()) as cur:
            return public.distinct_values(cur, table, column)


def _column_types(call: Call, dataset: Dataset) -> dict[str, str]:
    try:
        return call.engine_of(dataset).column_types(dataset.table)
    except EngineError as err:
        where = "its engine's server is down or the table changed" if dataset.engine \
            else "ask an administrator to check the store"
        raise InternalError(f"the table of dataset {dataset.name} cannot be read ({where}); "
                            "nothing was charged") from err


def _prepare(call: Call, entry: Entry) -> _Prepared:
    """Everything up to the cache look-up: price and calibrate (no SQL yet)."""
    plan = entry.plan
    cost = query_cost(call.policy, plan.dataset, call.ctx.options, plan.options or {})
    sql = SQLContext(call.ctx.store.secret, entry.types, exact=cost.infinite)
    noises = calibrate(plan, cost, call.policy.accounting, sql)
    key = cache.cache_key(call.user, call.policy.fingerprint, plan, cost)
    selection = Selection.of(plan, noises, selection_delta(call.policy.delta, cost,
                                                          plan.dataset.budget))
    return _Prepared(entry, cost, noises, key, sql, selection)


def _bind(call: Call, prepared: _Prepared) -> Prepared:
    """Generate the SQL and bind it without reading data (before the charge: free).

    Only a query the cache cannot answer gets here, so only it reads the bounds
    the database enforces (they decide which columns are clamped). SQL that bound
    before (same plan, context and column types) binds as it runs.
    """
    plan = prepared.plan
    if plan.dataset.engine is not None:
        check_total(plan, prepared.entry.types)
    clamped = clamped_columns(plan)
    engine = call.engine_of(plan.dataset)
    enforced = {c: b for c, b in engine.enforced_bounds(plan.dataset.table).items()
                if c in clamped} if clamped else {}
    sql = replace(prepared.sql, enforced=enforced)
    entry = prepared.entry
    query, key = entry.generated((sql.exact, enforced), lambda: to_sql(plan, sql))
    try:
        bound = engine.prepare(query, entry.texts.get(key))
    except EngineError as err:
        raise InternalError("dpsql generated a query the database cannot plan; this is a "
                            "bug in dpsql, please report it with your query") from err
    entry.texts[key] = bound.text
    return bound


def answer_dp(call: Call, entry: Entry, text: str, checked: bool) -> Answer:
    """Answer a DP query from its plan; ``checked``: the plan's types were read in this snapshot.

    A kept plan (not ``checked``) is used only while its table has the column
    types it was planned with; otherwise the text is planned again.
    """
    if not checked and not _same_types(call, entry.plan.dataset, entry.types):
        return _again(call, text)
    prepared = _prepare(call, entry)
    plan, policy = prepared.plan, call.policy
    dataset = plan.dataset.name
    _check_post(entry, prepared, call.ctx.options)
    stored = cache.lookup(call.ctx.store, prepared.key)
    if stored is not None:
        audit = call.ledger.record(call.user, dataset, text, Outcome.CACHED, cost=call.zero,
                                   reason=f"same measurement as request {stored.audit_id}")
        remaining = call.ledger.budget(call.user, dataset).remaining
        notice = (f"dpsql: {dataset}: repeated query answered from the cache at no cost "
                  f"(first answered in request {stored.audit_id}); remaining "
                  f"{meta.both_units(remaining, policy.delta, 'down')}")
        if stored.keys is not None:
            plan = released(plan, stored.keys)
        return _answer(call, plan, stored.noises, stored.measures, call.zero, remaining,
                       notice, True, audit)
    query = _bind(call, prepared)
    selection = prepared.selection
    charge = call.ledger.charge(call.user, dataset, prepared.cost, text,
                                delta=selection.delta if selection is not None else 0.0)
    notice = (f"dpsql: {dataset}: charged {meta.both_units(prepared.cost, policy.delta)}"
              f"{_selection_note(prepared.selection)}; "
              f"remaining {meta.both_units(charge.remaining, policy.delta, 'down')}")

    def answered(plan: QueryPlan, noisy: list[np.ndarray]) -> Answer:
        return _answer(call, plan, prepared.noises, noisy, prepared.cost, charge.remaining,
                       notice, False, charge.id)

    try:
        return _measured(call, prepared, query, charge.id, answered)
    except BaseException as err:
        if isinstance(err, QueryCanceled):  # a fixed text caused by the analyst, not the rows
            call.ledger.settle(charge.id, Outcome.FAILED, reason=str(err))
            raise
        call.ledger.settle(charge.id, Outcome.FAILED, reason=FAILED_REASON)
        log.error("request %d failed after its charge", charge.id, exc_info=err)
        raise InternalError(FAILED_AFTER_CHARGE) from None


def _check_post(entry: Entry, prepared: _Prepared, options: Mapping[str, Any]) -> None:
    """Refuse, before any charge, post-processing that could fail over the noisy answer."""
    level, nonnegative = confidence(options), nonnegative_counts(options)
    types = answer_types(prepared.noises, level, nonnegative)
    if types not in entry.post_checked:
        check_post(prepared.plan, prepared.noises, level, level or DEFAULT_CONFIDENCE,
                   nonnegative, entry.types)
        entry.post_checked.add(types)


def _measured(call: Call, prepared: _Prepared, query: Prepared, audit_id: int,
              answered: Callable[[QueryPlan, list[np.ndarray]], Answer]) -> Answer:
    """Run the charged query, add the noise, and settle the request with the stored answer.

    The snapshot ends and the reply is built before the settle is queued, so the
    settle's commit on the writer thread does not slow the reply down. A
    concurrent twin (same user, question and cost) that stored its answer first
    wins: its numbers are returned, so a repeat never gets a second draw.
    """
    plan, keys = prepared.plan, None
    if prepared.selection is not None:
        sparse = query.run()
        call.close()
        plan, noisy = select_keys(plan, sparse, prepared.noises, prepared.selection)  # type: ignore[arg-type]
        keys = plan.keys[0].values
    else:
        dense = expand_public_keys(plan, query.run())
        call.close()
        noisy = [n.release(d) for d, n in zip(dense, prepared.noises, strict=True)]
    answer = answered(plan, noisy)
    row = cache.stored_row(prepared.key, call.user, plan, call.policy.fingerprint, audit_id,
                           prepared.noises, noisy, keys)
    if call.ledger.settle(audit_id, Outcome.ANSWERED, answer=row):
        return answer
    twin = cache.lookup(call.ctx.store, prepared.key)
    assert twin is not None, "an answer that was stored first is still stored"
    return answered(plan if twin.keys is None else released(plan, twin.keys), twin.measures)


def _answer(call: Call, plan: QueryPlan, noises: tuple[MeasureNoise, ...],
            noisy: list[np.ndarray], cost: PrivacyCost, remaining: PrivacyCost, notice: str,
            cached: bool, audit_id: int) -> Answer:
    options = call.ctx.options
    level = confidence(options)
    judged = level or DEFAULT_CONFIDENCE
    base = base_table(plan, noisy, noises, level, judged, nonnegative_counts(options))
    table, flags = answer_table(plan, base, level)
    columns = _Described(plan, noises, call.policy.delta, level)
    return Answer(table, "dp", cost, remaining, plan.dataset.name, cached, columns, notice,
                  f"SELECT {table.num_rows}", audit_id, noise_dominated=flags,
                  warning=noise_warning(flags, table.num_rows, judged))


def noise_warning(flags: Mapping[str, list[bool]], rows: int, level: float) -> str | None:
    """The line that says which columns hold values that are mostly noise, or None."""
    found = [f"{name} in {sum(f)} of {rows} row(s)" for name, f in flags.items() if any(f)]
    if not found:
        return None
    return (f"dpsql: mostly noise at {level:g} confidence: {', '.join(found)} (a negative "
            "count, or an interval wider than the value; see noise_dominated); raise epsilon "
            "or group more coarsely (SET dpsql.target_error, then EXPLAIN PRIVACY, suggests "
            "an epsilon)")


class _Described(Mapping[str, dict[str, Any]]):
    """:func:`column_info` of an answer, worked out when first read.

    Most front ends (the wire server, ``dpsql query`` without ``--json``) never
    read it, and it costs as much as drawing the noise.
    """

    def __init__(self, plan: QueryPlan, noises: tuple[MeasureNoise, ...], delta: float | None,
                 level: float | None) -> None:
        self._args = (plan, noises, delta, level)

    @functools.cached_property
    def _info(self) -> dict[str, dict[str, Any]]:
        return column_info(*self._args)

    def __getitem__(self, name: str) -> dict[str, Any]:
        return self._info[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._info)

    def __len__(self) -> int:
        return len(self._info)

    def __repr__(self) -> str:
        return repr(self._info)


def column_info(plan: QueryPlan, noises: tuple[MeasureNoise, ...], delta: float | None,
                level: float | None) -> dict[str, dict[str, Any]]:
    """How each output column was computed: public key, noisy aggregate or post-processing."""
    level = level or DEFAULT_CONFIDENCE
    info: dict[str, dict[str, Any]] = {}
    for output in plan.outputs:
        if output.key is not None:
            key = plan.keys[output.key]
            info[output.name] = {"kind": "key", "column": key.column,
                                 "public": key.mode != "selected",
                                 "groups": None if key.mode == "selected" and not key.values
                                 else key.size}
        elif output.aggregate is not None:
            agg = plan.aggregates[output.aggregate]
            parts = [noises[m] for m in agg.measures]
            entry: dict[str, Any] = {"kind": "aggregate", "aggregate": agg.label}
            if len(parts) > 1:
                total = sum((p.cost for p in parts[1:]), parts[0].cost)
                entry.update(mechanism=parts[0].mechanism, cost=total.as_dict(delta),
                             note=SPLIT_NOTES[agg.func])
                entry.update({name: n.describe(delta, level)
                              for name, n in zip(PART_NAMES[agg.func], parts, strict=True)})
            else:
                entry.update(parts[0].describe(delta, level))
            info[output.name] = entry
        else:
            used = sorted({plan.aggregates[int(c.name[2:])].label
                           for c in output.expr.find_all(exp.Column) if c.name.startswith("_a")})
            info[output.name] = {"kind": "post-processing", "uses": used}
    return info


def _suggestion(plan: QueryPlan, suggested: list[PrivacyCost | None], target: float,
                level: float, delta: float | None) -> str:
    """The notice's sentence on the cost that meets ``dpsql.target_error``.

    Quantiles have no interval (their accuracy is a rank: ``rank_error``) and are left out.
    """
    head = f"for every interval at {level:g} within {target:g}"
    suggested = [c for c, m in zip(suggested, plan.measures, strict=True)
                 if m.kind != "quantile"]
    if not suggested:
        return f"{head}: no measurement has an interval (a quantile's accuracy is its rank_error)"
    reached = [c for c in suggested if c is not None]
    if len(reached) < len(suggested):
        return f"{head}: no cost reaches it for some measurement (see suggested_cost)"
    need = max(reached, key=lambda c: c.value)
    unit = "epsilon" if need.kind == "pure" else "rho"
    at = f" (epsilon={figure(need.epsilon(delta), 'up')} at delta={delta:g})" \
        if need.kind == "zcdp" and delta else ""
    return f"{head}: SET dpsql.{unit} = {figure(need.value, 'up')}{at}"


def explain(call: Call, ast: exp.Expr, inner: str, text: str) -> Answer:
    """EXPLAIN PRIVACY of the DP query ``inner``: its price and noise, nothing computed."""
    entry = planned(call, ast, inner)
    prepared = _prepare(call, entry)
    _bind(call, prepared)  # SQL that cannot bind is found here, at no cost
    plan, policy = prepared.plan, call.policy
    level = confidence(call.ctx.options) or DEFAULT_CONFIDENCE
    info = column_info(plan, prepared.noises, policy.delta, level)
    rows: dict[str, list[Any]] = {k: [] for k in (
        "column", "aggregate", "mechanism", "cost", "scale", "std", "ci_halfwidth",
        "confidence")}
    target = target_error(call.ctx.options)
    suggested = suggest(plan, policy.accounting, prepared.sql, level, target) \
        if target is not None else None
    for j, agg in enumerate(plan.aggregates):
        parts = PART_NAMES.get(agg.func, ("",))
        for m, part in zip(agg.measures, parts, strict=True):
            noise_ = prepared.noises[m]
            names = [o.name for o in plan.outputs if o.aggregate == j]
            rows["column"].append(", ".join(names) or "(HAVING/ORDER BY)")
            rows["aggregate"].append(agg.label + (f" [{part}]" if part else ""))
            rows["mechanism"].append(noise_.mechanism)
            rows["cost"].append(meta.both_units(noise_.cost, policy.delta))
            rows["scale"].append(noise_.scale)
            rows["std"].append(noise_.std())
            rows["ci_halfwidth"].append(noise_.halfwidth(level))
            rows["confidence"].append(level)
            if suggested is not None:
                found = suggested[m]
                rows.setdefault("suggested_cost", []).append(
                    None if found is None else meta.both_units(found, policy.delta))
    if prepared.selection is not None:
        _selection_row(rows, prepared, policy.delta)
    table = pa.table({k: pa.array(v, pa.string() if k == "suggested_cost" else None)
                      for k, v in rows.items()})
    cached = cache.lookup(call.ctx.store, prepared.key) is not None
    remaining = call.ledger.budget(call.user, plan.dataset.name).remaining
    would = "nothing (a repeat: answered from the cache)" if cached else \
        meta.both_units(prepared.cost, policy.delta)
    groups = f"{plan.cells} public group(s)" if prepared.selection is None else \
        f"groups chosen by DP partition selection{_selection_note(prepared.selection)}"
    notice = (f"dpsql: {plan.dataset.name}: this query would cost {would}; split equally "
              f"over {len(plan.measures)} measurement(s); {groups}; "
              f"remaining {meta.both_units(remaining, policy.delta, 'down')}")
    if suggested is not None and target is not None:  # suggested exactly with a target
        notice += "; " + _suggestion(plan, suggested, target, level, policy.delta)
    audit = call.ledger.record(call.user, plan.dataset.name, text, Outcome.EXPLAINED,
                               action="explain")
    return Answer(table, "explain", call.zero, remaining, plan.dataset.name, cached, info,
                  notice, "EXPLAIN", audit)


def _selection_note(selection: Selection | None) -> str:
    """What partition selection adds to a cost line: its delta (none without selection)."""
    if selection is None:
        return ""
    return (f", plus delta={selection.delta:g} for the keys released (noisy COUNT(*) >= "
            f"{selection.tau})")


def _selection_row(rows: dict[str, list[Any]], prepared: _Prepared, delta: float | None) -> None:
    """EXPLAIN PRIVACY's row for the COUNT(*) that decides which keys are released."""
    selection = prepared.selection
    assert selection is not None
    noise_ = prepared.noises[selection.measure]
    names = [o.name for o in prepared.plan.outputs if o.key is not None]
    rows["column"].append(", ".join(names) or "(GROUP BY key)")
    rows["aggregate"].append(f"partition selection [COUNT(*) >= {selection.tau}]")
    rows["mechanism"].append(noise_.mechanism)
    shared = any(selection.measure in a.measures for a in prepared.plan.aggregates)
    rows["cost"].append(f"delta={selection.delta:g} (its rho is COUNT(*)'s)" if shared else
                        f"{meta.both_units(noise_.cost, delta)}, plus delta={selection.delta:g}")
    for name, value in (("scale", noise_.scale), ("std", noise_.std()),
                        ("ci_halfwidth", None), ("confidence", None)):
        rows[name].append(value)
    if "suggested_cost" in rows:
        rows["suggested_cost"].append(None)
