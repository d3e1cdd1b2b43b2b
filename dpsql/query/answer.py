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

The DP path itself is :mod:`dpsql.query.dp`; the answer and the request's
tools are :mod:`dpsql.query.call`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import MappingProxyType

import duckdb
import pyarrow as pa
from sqlglot import exp

from dpsql.context import Context
from dpsql.engines.local import DuckDBEngine
from dpsql.errors import ConfigurationError, QueryRejected
from dpsql.outcomes import Outcome
from dpsql.query import meta
from dpsql.query.call import Answer, Call
from dpsql.query.dialect import nested_too_deeply, reject
from dpsql.query.dp import answer_dp, explain, planned, reused
from dpsql.query.free import FREE
from dpsql.query.options import (
    option_name,
    reset_option,
    set_option,
)
from dpsql.query.released import check_released, reads_released
from dpsql.query.statement import (
    ExplainStatement,
    QueryStatement,
    ResetStatement,
    SetStatement,
    ShowStatement,
    classify,
)

log = logging.getLogger(__name__)


def run_statement(ctx: Context, text: str) -> Answer:
    """Answer one statement for the request ``ctx``; rejections are audited and re-raised."""
    call = Call(ctx, ctx.ledger, DuckDBEngine(ctx.store, ctx.interrupts))
    try:
        return _statement(call, text)
    finally:
        call.close()


def _statement(call: Call, text: str) -> Answer:
    try:
        _check_encoding(text)
        entry = reused(call, text)
        if entry is not None:  # planned before: a DP query (same text and policy)
            return answer_dp(call, entry, text, checked=False)
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
            return explain(call, inner.ast, statement.text, text)
        return _query(call, statement.ast, text)
    except RecursionError:  # an expression too deep for one of the passes over it
        call.ledger.record(call.user, None, text, Outcome.REJECTED,
                           reason=str(nested_too_deeply()))
        raise nested_too_deeply() from None
    except (QueryRejected, ConfigurationError) as err:
        call.ledger.record(call.user, None, text, Outcome.REJECTED, reason=str(err)[:2000])
        raise


def _set(call: Call, statement: SetStatement | ResetStatement) -> Answer:
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


#: What ``SHOW <name>`` reads, by name (lower case); any other name is an option's.
SHOWN: dict[str, Callable[[Context], pa.Table]] = {
    "all": meta.all_options, "dpsql.all": meta.all_options,
    "dpsql.datasets": meta.datasets_table, "dpsql.released": meta.released_table,
    "dpsql.jobs": meta.jobs_table,
}


def _show(call: Call, name: str, text: str) -> Answer:
    lowered = name.lower()
    if lowered == "dpsql.budget":
        return _budget(call, "SHOW")
    if lowered in SHOWN:
        return Answer(SHOWN[lowered](call.ctx), "show", call.zero, status="SHOW")
    try:
        short = option_name(name)
    except QueryRejected as err:
        raise reject(text, f"SHOW {name} is not available", 0, construct="SHOW",
                     advice="SHOW dpsql.<option>, dpsql.budget, dpsql.datasets, "
                     "dpsql.released, dpsql.jobs (administrators) or ALL") from err
    return Answer(meta.option_rows(call.ctx, [short]), "show", call.zero, status="SHOW")


def _budget(call: Call, status: str | None = None) -> Answer:
    """The caller's budgets, with the line saying which unit adds up."""
    table = meta.budget_table(call.ctx)
    return Answer(table, "budget", call.zero, notice=meta.budget_note(call.policy.accounting),
                  status=status or f"SELECT {table.num_rows}")


def _query(call: Call, ast: exp.Expr, text: str) -> Answer:
    if _budget_call(ast):
        assert isinstance(ast, exp.Select)
        extra = [k for k, v in ast.args.items() if v and k not in ("expressions", "from_")]
        if extra or not all(isinstance(e, exp.Star) for e in ast.expressions):
            raise reject(text, "dpsql_budget() is read with SELECT * FROM dpsql_budget()", ast,
                         construct="dpsql_budget()", advice="SELECT * FROM dpsql_budget()")
        return _budget(call)
    if reads_released(ast) or ast.find(exp.From) is None:
        return _released(call, ast, text)
    return answer_dp(call, planned(call, ast, text), text, checked=True)


def _released(call: Call, ast: exp.Expr, text: str) -> Answer:
    """A free query: validated, then run on the isolated database (:mod:`dpsql.query.free`)."""
    store = call.ctx.store
    with store[FREE].using(store) as copy:
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
