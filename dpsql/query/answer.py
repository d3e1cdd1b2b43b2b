"""Answer every statement an analyst sends: the one router all front ends share.

``run_statement`` handles DP SELECTs, ``SET``/``RESET``/``SHOW dpsql.*``,
``SHOW dpsql.budget`` and ``SELECT * FROM dpsql_budget()``, ``EXPLAIN PRIVACY``
and read-only queries over ``released.*`` tables. A DP query goes: parse and
validate -> plan (or reuse the user's plan of the same text while its table keeps
its column types, :mod:`dpsql.query.plancache`) -> calibrate noise -> cache
lookup -> bind the generated SQL (refusals up to here cost nothing) -> **charge**
-> run the generated SQL -> expand the public keys -> add noise -> settle the
request with the stored noisy measures -> post-process. The ledger charges
before any private value is computed. Any failure after the charge keeps the
charge and gives one fixed reply and audit reason, whatever the rows or the
database's message.

The code here receives the request's immutable :class:`~dpsql.context.Context`,
never the Session: a ``SET`` returns the new options in :attr:`Answer.options`
for the session to keep.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
from sqlglot import exp

from dpsql import public
from dpsql.context import Context
from dpsql.engines import engine_for
from dpsql.engines.base import Engine, EngineError, Prepared
from dpsql.engines.local import DuckDBEngine
from dpsql.errors import ConfigurationError, InternalError, QueryCanceled, QueryRejected
from dpsql.ledger import Ledger, Outcome
from dpsql.policy import Dataset, Policy
from dpsql.privacy import PrivacyCost, figure
from dpsql.query import cache, meta
from dpsql.query.dialect import nested_too_deeply, reject
from dpsql.query.model import SPREAD, QueryPlan
from dpsql.query.options import (
    confidence,
    nonnegative_counts,
    option_name,
    query_cost,
    reset_option,
    set_option,
    target_error,
)
from dpsql.query.plancache import Entry
from dpsql.query.planner import plan_query
from dpsql.query.portable import check_total
from dpsql.query.post import answer_table, answer_types, base_table, check_post
from dpsql.query.quantile import MeasureNoise
from dpsql.query.released import check_released, reads_released
from dpsql.query.render import Context as SQLContext
from dpsql.query.render import calibrate, clamped_columns, expand_public_keys, to_sql
from dpsql.query.selection import Selection, released, select_keys, selection_delta
from dpsql.query.statement import (
    ExplainStatement,
    QueryStatement,
    ResetStatement,
    SetStatement,
    ShowStatement,
    classify,
)
from dpsql.query.target import suggest
from dpsql.store import Store

DEFAULT_CONFIDENCE = 0.95
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
class Answer:
    """The result of one statement, ready for any front end.

    ``table``: the rows. ``kind``: dp, released, explain, set, show or budget.
    ``cost``: what this statement was charged (zero when free). ``remaining``:
    the caller's budget left on ``dataset`` (DP answers). ``cached``: a repeat
    served from the cache. ``columns``: per output column, how it was computed
    (mechanism, scale, expected error, cost share). ``notice``: one line for
    the analyst (cost in both units, budget left). ``status``: the command tag.
    ``noise_dominated``: per aggregate column, whether each row's value is
    mostly noise (:func:`dpsql.query.post.dominated`); ``warning``: one line
    saying so when any is (the wire server sends it as a second notice).
    """

    table: pa.Table
    kind: str
    cost: PrivacyCost
    remaining: PrivacyCost | None = None
    dataset: str | None = None
    cached: bool = False
    columns: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    notice: str | None = None
    status: str = ""
    audit_id: int | None = None
    options: Mapping[str, Any] | None = None  # the session's new options after SET/RESET
    noise_dominated: Mapping[str, list[bool]] = field(default_factory=dict)
    warning: str | None = None

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame."""
        return self.table.to_pandas()

    def as_dict(self, delta: float | None = None) -> dict[str, Any]:
        """JSON-able form: rows, cost, remaining budget and per-column accuracy."""
        return {
            "kind": self.kind, "status": self.status, "dataset": self.dataset,
            "cost": self.cost.as_dict(delta),
            "remaining": self.remaining.as_dict(delta) if self.remaining else None,
            "cached": self.cached, "notice": self.notice, "warning": self.warning,
            "noise_dominated": dict(self.noise_dominated),
            "columns": dict(self.columns), "rows": self.table.to_pylist(),
        }


@dataclass(frozen=True)
class _Call:
    """One statement: its request context, ledger and engine (one snapshot)."""

    ctx: Context
    ledger: Ledger
    engine: Engine  # the store's; a dataset on another engine gets its own
    others: dict[str, Engine] = field(default_factory=dict)

    def engine_of(self, dataset: Dataset) -> Engine:
        """The engine holding ``dataset``'s rows (one per statement and dataset)."""
        if dataset.engine is None:
            return self.engine
        if dataset.name not in self.others:
            self.others[dataset.name] = engine_for(dataset, self.ctx.store, self.ctx.interrupts,
                                                   self.ctx.links)
        return self.others[dataset.name]

    def close(self) -> None:
        """End every snapshot the statement opened."""
        self.engine.close()
        for engine in self.others.values():
            engine.close()

    @property
    def user(self) -> str:
        return self.ctx.user

    @property
    def policy(self) -> Policy:
        return self.ctx.policy

    @property
    def zero(self) -> PrivacyCost:
        return PrivacyCost.zero(self.policy.accounting)


def run_statement(ctx: Context, text: str) -> Answer:
    """Answer one statement for the request ``ctx``; rejections are audited and re-raised."""
    call = _Call(ctx, ctx.ledger, DuckDBEngine(ctx.store, ctx.interrupts))
    try:
        return _statement(call, text)
    finally:
        call.close()


def _statement(call: _Call, text: str) -> Answer:
    try:
        _check_encoding(text)
        entry = _reused(call, text)
        if entry is not None:  # planned before: a DP query (same text and policy)
            return _dp(call, entry, text, checked=False)
        statement = classify(text)
        if isinstance(statement, (SetStatement, ResetStatement)):
            return _set(call, statement)
        if isinstance(statement, ShowStatement):
            return _show(call, statement.name, text)
        if isinstance(statement, ExplainStatement):
            inner = classify(statement.text)
            if not isinstance(inner, QueryStatement) or reads_released(inner.ast) \
                    or _budget_call(inner.ast):
                raise reject(text, "EXPLAIN PRIVACY takes a DP query", statement.offset,
                             construct="EXPLAIN PRIVACY",
                             advice="EXPLAIN PRIVACY SELECT COUNT(*) FROM <dataset> ...")
            return _explain(call, inner.ast, statement.text, text)
        return _query(call, statement.ast, text)
    except RecursionError:  # an expression too deep for one of the passes over it
        call.ledger.record(call.user, None, text, Outcome.REJECTED,
                           reason=str(nested_too_deeply()))
        raise nested_too_deeply() from None
    except (QueryRejected, ConfigurationError) as err:
        call.ledger.record(call.user, None, text, Outcome.REJECTED, reason=str(err)[:2000])
        raise


def _set(call: _Call, statement: SetStatement | ResetStatement) -> Answer:
    """SET or RESET an option: the answer carries the session's new options."""
    options = dict(call.ctx.options)
    if isinstance(statement, SetStatement):
        set_option(options, statement.name, statement.value)
        status = "SET"
    else:
        reset_option(options, statement.name)
        status = "RESET"
    return Answer(pa.table({}), "set", call.zero, status=status,
                  options=MappingProxyType(options))


def _check_encoding(text: str) -> None:
    """Refuse text that is not valid Unicode (lone surrogates stand for undecodable bytes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise reject(text, "the statement is not valid UTF-8", err.start, construct="encoding",
                     advice="send the statement as UTF-8 text") from None


def _budget_call(ast: exp.Expr) -> bool:
    source = ast.args.get("from_") if isinstance(ast, exp.Select) else None
    table = source.this if source is not None else None
    return isinstance(table, exp.Table) and isinstance(table.this, exp.Anonymous) \
        and table.this.name.lower() == "dpsql_budget"


def _show(call: _Call, name: str, text: str) -> Answer:
    ctx, zero = call.ctx, call.zero
    lowered = name.lower()
    if lowered == "dpsql.budget":
        return _budget(call, "SHOW")
    if lowered in ("all", "dpsql.all"):
        return Answer(meta.all_options(ctx), "show", zero, status="SHOW")
    if lowered == "dpsql.datasets":
        return Answer(meta.datasets_table(ctx), "show", zero, status="SHOW")
    if lowered == "dpsql.released":
        return Answer(meta.released_table(ctx), "show", zero, status="SHOW")
    if lowered == "dpsql.jobs":
        return Answer(meta.jobs_table(ctx), "show", zero, status="SHOW")
    try:
        short = option_name(name)
    except QueryRejected as err:
        raise reject(text, f"SHOW {name} is not available", 0, construct="SHOW",
                     advice="SHOW dpsql.<option>, dpsql.budget, dpsql.datasets, "
                     "dpsql.released, dpsql.jobs (administrators) or ALL") from err
    return Answer(meta.option_rows(ctx, [short]), "show", zero, status="SHOW")


def _budget(call: _Call, status: str | None = None) -> Answer:
    """The caller's budgets, with the line saying which unit adds up."""
    table = meta.budget_table(call.ctx)
    return Answer(table, "budget", call.zero, notice=meta.budget_note(call.policy.accounting),
                  status=status or f"SELECT {table.num_rows}")


def _query(call: _Call, ast: exp.Expr, text: str) -> Answer:
    if _budget_call(ast):
        assert isinstance(ast, exp.Select)
        extra = [k for k, v in ast.args.items() if v and k not in ("expressions", "from_")]
        if extra or not all(isinstance(e, exp.Star) for e in ast.expressions):
            raise reject(text, "dpsql_budget() is read with SELECT * FROM dpsql_budget()", ast,
                         construct="dpsql_budget()", advice="SELECT * FROM dpsql_budget()")
        return _budget(call)
    if reads_released(ast) or ast.find(exp.From) is None:
        return _released(call, ast, text)
    return _dp(call, _planned(call, ast, text), text, checked=True)


def _released(call: _Call, ast: exp.Expr, text: str) -> Answer:
    """A free query: validated, then run on the isolated database (:mod:`dpsql.query.free`)."""
    store = call.ctx.store
    with store.services.free.using(store) as copy:
        check_released(ast, text, set(copy.names))
        try:  # in a sandbox process: OutOfMemory and QueryCanceled pass through
            table = copy.run(ast.sql(dialect="duckdb"), user=call.user,
                             interrupts=call.ctx.interrupts)
        except duckdb.Error as err:
            # The isolated database holds DP output only, so its message may be shown.
            raise QueryRejected("the query on released tables failed: "
                                f"{str(err).splitlines()[0]}", construct="query",
                                advice="check the column names (SHOW dpsql.released lists the "
                                "tables)") from err
    audit = call.ledger.record(call.user, None, text, Outcome.ANSWERED, action="released")
    return Answer(table, "released", call.zero, status=f"SELECT {table.num_rows}",
                  audit_id=audit)


# -- DP queries --------------------------------------------------------------------------


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


def _planned(call: _Call, ast: exp.Expr, text: str) -> Entry:
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
    call.ctx.store.services.plans.put(call.user, text, call.policy.fingerprint, entry)
    return entry


def _reused(call: _Call, text: str) -> Entry | None:
    """The plan of the user's ``text`` made under this policy, if kept.

    Its table's column types are compared with the plan's in the statement's
    snapshot before it is used (:func:`_dp`).
    """
    return call.ctx.store.services.plans.get(call.user, text, call.policy.fingerprint)


def _again(call: _Call, text: str) -> Answer:
    """Forget the stale kept plan of ``text``, plan the text anew and answer it."""
    call.ctx.store.services.plans.drop(call.user, text, call.policy.fingerprint)
    statement = classify(text)
    assert isinstance(statement, QueryStatement)  # it was planned as a DP query before
    return _query(call, statement.ast, text)


def _same_types(call: _Call, dataset: Dataset, types: Mapping[str, str]) -> bool:
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


def _column_types(call: _Call, dataset: Dataset) -> dict[str, str]:
    try:
        return call.engine_of(dataset).column_types(dataset.table)
    except EngineError as err:
        where = "its engine's server is down or the table changed" if dataset.engine \
            else "ask an administrator to check the store"
        raise InternalError(f"the table of dataset {dataset.name} cannot be read ({where}); "
                            "nothing was charged") from err


def _prepare(call: _Call, entry: Entry) -> _Prepared:
    """Everything up to the cache look-up: price and calibrate (no SQL yet)."""
    plan = entry.plan
    cost = query_cost(call.policy, plan.dataset, call.ctx.options, plan.options or {})
    sql = SQLContext(call.ctx.store.secret, entry.types, exact=cost.infinite)
    noises = calibrate(plan, cost, call.policy.accounting, sql)
    key = cache.cache_key(call.user, call.policy.fingerprint, plan, cost)
    selection = Selection.of(plan, noises, selection_delta(call.policy.delta, cost,
                                                          plan.dataset.budget))
    return _Prepared(entry, cost, noises, key, sql, selection)


def _bind(call: _Call, prepared: _Prepared) -> Prepared:
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


def _dp(call: _Call, entry: Entry, text: str, checked: bool) -> Answer:
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


def _measured(call: _Call, prepared: _Prepared, query: Prepared, audit_id: int,
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


def _answer(call: _Call, plan: QueryPlan, noises: tuple[MeasureNoise, ...],
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


def _explain(call: _Call, ast: exp.Expr, inner: str, text: str) -> Answer:
    entry = _planned(call, ast, inner)
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
