"""Answer every statement an analyst sends: the one router all front ends share.

``run_statement`` handles DP SELECTs, ``SET``/``RESET``/``SHOW dpsql.*``,
``SHOW dpsql.budget`` and ``SELECT * FROM dpsql_budget()``, ``EXPLAIN PRIVACY``
and read-only queries over ``released.*`` tables. A DP query goes: parse and
validate -> plan (or reuse the user's plan of the same text,
:mod:`dpsql.query.plancache`) -> calibrate noise (refusals cost nothing, but for
a kept plan whose table changed under it) -> cache lookup ->
**charge** -> run the generated SQL -> expand the public keys -> add noise ->
store the noisy measures -> post-process. The ledger charges before any
private value is computed; while the charge commits, a helper thread checks
that a kept plan's table still has its column types and binds the generated
SQL, and another draws the noise while the query runs (neither reads a
private value). Any failure after the charge keeps the charge and gives one
fixed reply and audit reason, whatever the rows or the database's message.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
from sqlglot import exp

from dpsql.errors import ConfigurationError, InternalError, QueryCanceled, QueryRejected
from dpsql.ledger import Ledger
from dpsql.policy import Dataset, Policy
from dpsql.privacy import PrivacyCost
from dpsql.query import cache, meta
from dpsql.query.dialect import nested_too_deeply, reject
from dpsql.query.engine import DuckDBEngine, Engine, EngineError, Prepared
from dpsql.query.free import FreeDatabase
from dpsql.query.mechanisms import Noise
from dpsql.query.model import QueryPlan
from dpsql.query.options import (
    confidence,
    option_name,
    query_cost,
    reset_option,
    set_option,
)
from dpsql.query.plancache import Entry, plans_of
from dpsql.query.planner import plan_query
from dpsql.query.post import answer_table, base_table
from dpsql.query.released import check_released, reads_released
from dpsql.query.render import Context, calibrate, clamped_columns, expand_public_keys, to_sql
from dpsql.query.statement import (
    ExplainStatement,
    QueryStatement,
    ResetStatement,
    SetStatement,
    ShowStatement,
    classify,
)

if TYPE_CHECKING:
    from dpsql.session import Session

DEFAULT_CONFIDENCE = 0.95
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

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame."""
        return self.table.to_pandas()

    def as_dict(self, delta: float | None = None) -> dict[str, Any]:
        """JSON-able form: rows, cost, remaining budget and per-column accuracy."""
        return {
            "kind": self.kind, "status": self.status, "dataset": self.dataset,
            "cost": self.cost.as_dict(delta),
            "remaining": self.remaining.as_dict(delta) if self.remaining else None,
            "cached": self.cached, "notice": self.notice,
            "columns": dict(self.columns), "rows": self.table.to_pylist(),
        }


def engine_for(session: Session) -> Engine:
    """The engine that runs generated SQL for ``session``'s store."""
    return DuckDBEngine(session.store, session.interrupts)


@dataclass(frozen=True)
class _Call:
    """One statement's view of the session: the policy in force when it arrived."""

    session: Session
    policy: Policy
    ledger: Ledger
    engine: Engine

    @property
    def user(self) -> str:
        return self.session.user

    @property
    def zero(self) -> PrivacyCost:
        return PrivacyCost.zero(self.policy.accounting)


def run_statement(session: Session, text: str) -> Answer:
    """Answer one statement as ``session``'s user; rejections are audited and re-raised."""
    policy = session.policy
    call = _Call(session, policy, Ledger(session.store, policy), engine_for(session))
    with session.store.holding_writes():  # the bookkeeping starts once the answer is ready
        try:
            return _statement(call, text)
        finally:
            call.engine.close()


def _statement(call: _Call, text: str) -> Answer:
    session = call.session
    try:
        _check_encoding(text)
        entry = _reused(call, text)
        if entry is not None:  # planned before: a DP query (same text and policy)
            return _dp(call, entry, text, checked=False)
        statement = classify(text)
        if isinstance(statement, SetStatement):
            set_option(session.options, statement.name, statement.value)
            return Answer(pa.table({}), "set", call.zero, status="SET")
        if isinstance(statement, ResetStatement):
            reset_option(session.options, statement.name)
            return Answer(pa.table({}), "set", call.zero, status="RESET")
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
        call.ledger.record(session.user, None, text, "rejected",
                           reason=str(nested_too_deeply()))
        raise nested_too_deeply() from None
    except (QueryRejected, ConfigurationError) as err:
        if not isinstance(err, _RefusedAfterCharge):  # that one closed its charge
            call.ledger.record(session.user, None, text, "rejected", reason=str(err)[:2000])
        raise


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
    session, zero = call.session, call.zero
    lowered = name.lower()
    if lowered == "dpsql.budget":
        return _budget(call, "SHOW")
    if lowered in ("all", "dpsql.all"):
        return Answer(meta.all_options(session), "show", zero, status="SHOW")
    if lowered == "dpsql.datasets":
        return Answer(meta.datasets_table(session), "show", zero, status="SHOW")
    if lowered == "dpsql.released":
        return Answer(meta.released_table(session), "show", zero, status="SHOW")
    try:
        short = option_name(name)
    except QueryRejected as err:
        raise reject(text, f"SHOW {name} is not available", 0, construct="SHOW",
                     advice="SHOW dpsql.<option>, dpsql.budget, dpsql.datasets, "
                     "dpsql.released or ALL") from err
    return Answer(meta.option_rows(session, [short]), "show", zero, status="SHOW")


def _budget(call: _Call, status: str | None = None) -> Answer:
    """The caller's budgets, with the line saying which unit adds up."""
    table = meta.budget_table(call.session)
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
    store = call.session.store
    with store.state(FreeDatabase).cursor(store) as (cursor, names):
        check_released(ast, text, set(names))
        try:
            with call.session.interrupts.running(cursor):
                table = cursor.sql(ast.sql(dialect="duckdb")).to_arrow_table()
        except duckdb.Error as err:
            # The isolated database holds DP output only, so its message may be shown.
            raise QueryRejected("the query on released tables failed: "
                                f"{str(err).splitlines()[0]}", construct="query",
                                advice="check the column names (SHOW dpsql.released lists the "
                                "tables)") from err
    audit = call.ledger.record(call.user, None, text, "answered", action="released")
    return Answer(table, "released", call.zero, status=f"SELECT {table.num_rows}",
                  audit_id=audit)


# -- DP queries --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prepared:
    entry: Entry
    cost: PrivacyCost
    noises: tuple[Noise, ...]
    key: str
    ctx: Context

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

    plan = plan_query(ast, text, call.policy, types_of)
    if not plan.measures:
        raise reject(text, "a DP query needs at least one aggregate", ast,
                     construct="SELECT", advice="add COUNT(*), SUM(col) or AVG(col)")
    entry = Entry(plan, types_of(plan.dataset))
    plans_of(call.session.store).put(call.user, text, call.policy.fingerprint, entry)
    return entry


def _reused(call: _Call, text: str) -> Entry | None:
    """The plan of the user's ``text`` made under this policy, if kept.

    Its table's column types are compared with the plan's in the statement's
    snapshot later: on a helper while the charge commits, or before a cached
    answer is served (:func:`_dp`).
    """
    return plans_of(call.session.store).get(call.user, text, call.policy.fingerprint)


class _TableChanged(Exception):
    """A kept plan's table no longer has the column types the plan was made for."""


class _RefusedAfterCharge(QueryRejected):
    """A kept plan's text no longer plans, found after its charge (which stands)."""


def _parsed_again(call: _Call, text: str) -> exp.Expr:
    """Forget the stale kept plan of ``text`` and parse the text again."""
    plans_of(call.session.store).drop(call.user, text, call.policy.fingerprint)
    statement = classify(text)
    assert isinstance(statement, QueryStatement)  # it was planned as a DP query before
    return statement.ast


def _again(call: _Call, text: str) -> Answer:
    """Plan ``text`` anew (its kept plan is stale) and answer it."""
    return _query(call, _parsed_again(call, text), text)


def _same_types(call: _Call, dataset: Dataset, types: Mapping[str, str]) -> bool:
    """Whether ``dataset``'s table still has ``types`` (a table that cannot be read has not)."""
    try:
        return _column_types(call, dataset) == types
    except InternalError:
        return False


def _column_types(call: _Call, dataset: Dataset) -> dict[str, str]:
    try:
        return call.engine.column_types(dataset.table)
    except EngineError as err:
        raise InternalError(f"the table of dataset {dataset.name} cannot be read; "
                            "ask an administrator to check the store") from err


def _prepare(call: _Call, entry: Entry) -> _Prepared:
    """Everything up to the cache look-up: price and calibrate (no SQL yet)."""
    plan = entry.plan
    cost = query_cost(call.policy, plan.dataset, call.session.options, plan.options or {})
    ctx = Context(cache.secret(call.session.store), entry.types, exact=cost.infinite)
    noises = calibrate(plan, cost, call.policy.accounting, ctx)
    key = cache.cache_key(call.user, call.policy.fingerprint, plan, cost)
    return _Prepared(entry, cost, noises, key, ctx)


def _bind(call: _Call, prepared: _Prepared, types: Mapping[str, str] | None = None) -> Prepared:
    """Generate the SQL and bind it without reading data.

    Only a query the cache cannot answer gets here, so only it reads the bounds
    the database enforces (they decide which columns are clamped). With
    ``types`` (a kept plan's), the table's column types are read first and must
    match, or :class:`_TableChanged` is raised (also if the table cannot be read:
    planning the text again then refuses it, and forgets the plan).
    """
    plan = prepared.plan
    if types is not None and not _same_types(call, plan.dataset, types):
        raise _TableChanged
    clamped = clamped_columns(plan)
    enforced = {c: b for c, b in call.engine.enforced_bounds(plan.dataset.table).items()
                if c in clamped} if clamped else {}
    ctx = replace(prepared.ctx, enforced=enforced)
    sql = prepared.entry.generated((ctx.exact, enforced), lambda: to_sql(plan, ctx))
    try:
        return call.engine.prepare(sql)
    except EngineError as err:
        raise InternalError("dpsql generated a query the database cannot plan; this is a "
                            "bug in dpsql, please report it with your query") from err


def _dp(call: _Call, entry: Entry, text: str, checked: bool) -> Answer:
    """Answer a DP query from its plan; ``checked``: the plan's types were read in this snapshot.

    A kept plan (not ``checked``) is priced and charged while a helper reads its
    table's types; if they changed, the text is planned again (after the charge,
    under the same charge: the price depends on the options, not the types).
    """
    try:
        prepared = _prepare(call, entry)
    except (QueryRejected, ConfigurationError):
        if checked or _same_types(call, entry.plan.dataset, entry.types):
            raise
        return _again(call, text)
    plan, store, policy = prepared.plan, call.session.store, call.policy
    dataset = plan.dataset.name
    stored = cache.lookup(store, prepared.key)
    if stored is not None:
        if not checked and not _same_types(call, entry.plan.dataset, entry.types):
            return _again(call, text)
        audit = call.ledger.record(call.user, dataset, text, "cached", cost=call.zero,
                                   reason=f"same measurement as request {stored.audit_id}")
        remaining = call.ledger.budget(call.user, dataset).remaining
        notice = (f"dpsql: {dataset}: repeated query answered from the cache at no cost "
                  f"(first answered in request {stored.audit_id}); remaining "
                  f"{meta.both_units(remaining, policy.delta, 'down')}")
        return _answer(call, plan, stored.noises, stored.measures, call.zero, remaining,
                       notice, True, audit)
    bound = _helpers().submit(_bind, call, prepared,  # while the charge commits
                              None if checked else entry.types)
    try:
        return _charged(call, entry, prepared, bound, text)
    finally:
        _wait_out(bound)  # it may be using the statement's cursor


def _charged(call: _Call, entry: Entry, prepared: _Prepared, bound: futures.Future[Prepared],
             text: str) -> Answer:
    """Charge, run, add the noise and store the answer (``bound`` binds the SQL meanwhile).

    The noise (and the notice) are made on a helper while the query runs: the
    database releases the GIL as it aggregates, while during the charge a
    Python draw would delay the commit's own Python steps.
    """
    store, policy = call.session.store, call.policy
    dataset = prepared.plan.dataset.name
    if not entry.bound:  # a plan's first SQL binds before the charge: a dpsql bug costs nothing
        try:
            bound.result()
        except _TableChanged:
            return _again(call, text)
        entry.bound = True
    charge = call.ledger.charge(call.user, dataset, prepared.cost, text, caller_audits=True)
    try:
        try:
            query = bound.result()
        except _TableChanged:
            entry, prepared, query = _planned_again(call, text, prepared.cost)
        plan = prepared.plan
        drawn = _helpers().submit(_draw, call, prepared, charge.remaining)
        result = query.run()
        draws, notice = drawn.result()
        dense = expand_public_keys(plan, result)
        noisy = [d + z for d, z in zip(dense, draws, strict=True)]
        noisy = cache.save(store, prepared.key, call.user, plan, policy.fingerprint,
                           charge.id, prepared.noises, noisy,
                           lambda cur: call.ledger.close(charge, "answered", cursor=cur))
    except BaseException as err:
        if isinstance(err, (_RefusedAfterCharge, QueryCanceled)):
            # Fixed texts caused by the schema or by the analyst's cancel, not by the rows.
            call.ledger.close(charge, "failed", reason=str(err)[:2000])
            raise
        call.ledger.close(charge, "failed", reason=FAILED_REASON)
        log.error("request %d failed after its charge", charge.id, exc_info=err)
        raise InternalError(FAILED_AFTER_CHARGE) from None
    return _answer(call, plan, prepared.noises, noisy, prepared.cost, charge.remaining,
                   notice, False, charge.id)


def _planned_again(call: _Call, text: str,
                   cost: PrivacyCost) -> tuple[Entry, _Prepared, Prepared]:
    """Plan ``text`` again after its table changed, to run under the charge ``cost`` made.

    The new plan is priced like the old one (the price depends on the options
    only); one that is refused now leaves the charge standing.
    """
    ast = _parsed_again(call, text)
    try:
        entry = _planned(call, ast, text)
        prepared = _prepare(call, entry)
    except (QueryRejected, ConfigurationError) as err:
        first = err.message if isinstance(err, QueryRejected) else str(err)
        raise _RefusedAfterCharge(
            f"the table changed after this query was charged, and the charge stands: {first}",
            construct=getattr(err, "construct", None), line=getattr(err, "line", None),
            column=getattr(err, "column", None), advice=getattr(err, "advice", None)) from None
    if prepared.cost != cost:
        raise InternalError("a query planned again after its table changed was priced "
                            "differently; this is a bug in dpsql, please report it")
    query = _bind(call, prepared)
    entry.bound = True
    return entry, prepared, query


def _draw(call: _Call, prepared: _Prepared,
          remaining: PrivacyCost) -> tuple[list[np.ndarray], str]:
    """The noise of every measure (one draw per public cell) and the notice; reads no data."""
    delta, dataset = call.policy.delta, prepared.plan.dataset.name
    draws = [n.sample(prepared.plan.cells) for n in prepared.noises]
    return draws, (f"dpsql: {dataset}: charged {meta.both_units(prepared.cost, delta)}; "
                   f"remaining {meta.both_units(remaining, delta, 'down')}")


def _wait_out(ready: futures.Future[Any]) -> None:
    """Wait for ``ready`` to end, through interrupts too: it may be using the statement's cursor."""
    interrupted: BaseException | None = None
    while not ready.done():
        try:
            futures.wait([ready])
        except BaseException as err:  # e.g. Ctrl-C: wait on, then raise it
            interrupted = err
    if interrupted is not None:
        raise interrupted


_helper_pool: futures.ThreadPoolExecutor | None = None
_helper_lock = threading.Lock()


def _helpers() -> futures.ThreadPoolExecutor:
    """The threads that ready queries (made as needed, one per concurrent statement)."""
    global _helper_pool
    with _helper_lock:
        if _helper_pool is None:
            _helper_pool = futures.ThreadPoolExecutor(64, thread_name_prefix="dpsql-ready")
        return _helper_pool


def _forget_helpers() -> None:  # a forked child has none of its parent's threads
    global _helper_pool
    _helper_pool = None


os.register_at_fork(after_in_child=_forget_helpers)


def _answer(call: _Call, plan: QueryPlan, noises: tuple[Noise, ...],
            noisy: list[np.ndarray], cost: PrivacyCost, remaining: PrivacyCost, notice: str,
            cached: bool, audit_id: int) -> Answer:
    level = confidence(call.session.options)
    table = answer_table(plan, base_table(plan, noisy, noises, level), level)
    columns = _Described(plan, noises, call.policy.delta, level)
    return Answer(table, "dp", cost, remaining, plan.dataset.name, cached, columns, notice,
                  f"SELECT {table.num_rows}", audit_id)


class _Described(Mapping[str, dict[str, Any]]):
    """:func:`column_info` of an answer, worked out when first read.

    Most front ends (the wire server, ``dpsql query`` without ``--json``) never
    read it, and it costs as much as drawing the noise.
    """

    def __init__(self, plan: QueryPlan, noises: tuple[Noise, ...], delta: float | None,
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


def column_info(plan: QueryPlan, noises: tuple[Noise, ...], delta: float | None,
                level: float | None) -> dict[str, dict[str, Any]]:
    """How each output column was computed: public key, noisy aggregate or post-processing."""
    level = level or DEFAULT_CONFIDENCE
    info: dict[str, dict[str, Any]] = {}
    for output in plan.outputs:
        if output.key is not None:
            key = plan.keys[output.key]
            info[output.name] = {"kind": "key", "column": key.column, "public": True,
                                 "groups": key.size}
        elif output.aggregate is not None:
            agg = plan.aggregates[output.aggregate]
            parts = [noises[m] for m in agg.measures]
            entry: dict[str, Any] = {"kind": "aggregate", "aggregate": agg.label}
            if agg.func == "avg":
                total = parts[0].cost + parts[1].cost
                entry.update(mechanism=parts[0].mechanism, cost=total.as_dict(delta),
                             sum=parts[0].describe(delta, level),
                             count=parts[1].describe(delta, level),
                             note="noisy sum / noisy count; its error depends on the count")
            else:
                entry.update(parts[0].describe(delta, level))
            info[output.name] = entry
        else:
            used = sorted({plan.aggregates[int(c.name[2:])].label
                           for c in output.expr.find_all(exp.Column) if c.name.startswith("_a")})
            info[output.name] = {"kind": "post-processing", "uses": used}
    return info


def _explain(call: _Call, ast: exp.Expr, inner: str, text: str) -> Answer:
    entry = _planned(call, ast, inner)
    prepared = _prepare(call, entry)
    _bind(call, prepared)  # SQL that cannot bind is found here, at no cost
    entry.bound = True
    plan, policy = prepared.plan, call.policy
    level = confidence(call.session.options) or DEFAULT_CONFIDENCE
    info = column_info(plan, prepared.noises, policy.delta, level)
    rows: dict[str, list[Any]] = {k: [] for k in (
        "column", "aggregate", "mechanism", "cost", "scale", "std", "ci_halfwidth",
        "confidence")}
    for j, agg in enumerate(plan.aggregates):
        parts = ("sum", "count") if agg.func == "avg" else ("",)
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
    table = pa.table({k: pa.array(v) for k, v in rows.items()})
    cached = cache.lookup(call.session.store, prepared.key) is not None
    remaining = call.ledger.budget(call.user, plan.dataset.name).remaining
    would = "nothing (a repeat: answered from the cache)" if cached else \
        meta.both_units(prepared.cost, policy.delta)
    notice = (f"dpsql: {plan.dataset.name}: this query would cost {would}; split equally "
              f"over {len(plan.measures)} measurement(s); {plan.cells} public group(s); "
              f"remaining {meta.both_units(remaining, policy.delta, 'down')}")
    audit = call.ledger.record(call.user, plan.dataset.name, text, "explained",
                               action="explain")
    return Answer(table, "explain", call.zero, remaining, plan.dataset.name, cached, info,
                  notice, "EXPLAIN", audit)
