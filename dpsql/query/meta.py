"""Tables answering statements about the session rather than the data.

``SHOW dpsql.<option>`` / ``SHOW ALL``, ``SHOW dpsql.budget`` and
``SELECT * FROM dpsql_budget()`` (the caller's own budgets), ``SHOW
dpsql.datasets`` (the public schema: columns and their domains) and ``SHOW
dpsql.released`` (released synthetic tables), ``SHOW dpsql.jobs`` (release jobs,
administrators only). Everything here is public information or the caller's own
standing; nothing reads sensitive rows.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dpsql.privacy import WHY_RHO, PrivacyCost, Rounding, figure
from dpsql.query.options import OPTIONS, confidence
from dpsql.query.released import SCHEMA

if TYPE_CHECKING:
    from dpsql.context import Context
    from dpsql.ledger import Budget


def both_units(cost: PrivacyCost, delta: float | None, rounding: Rounding = "up") -> str:
    """A cost in both units: rho with its (epsilon, delta), or epsilon with its rho."""
    if cost.kind == "zcdp" or cost.infinite:
        return cost.describe(delta, rounding)
    return f"{cost.describe(rounding=rounding)} ({cost.to_zcdp().describe(rounding=rounding)})"


#: How each figure of a standing rounds: never more left, nor less spent, than is true.
ROUNDING: dict[str, Rounding] = {"granted": "nearest", "spent": "up", "remaining": "down"}


def budget_note(accounting: str) -> str:
    """The line under every budget table: which unit adds up, and why epsilons do not."""
    return f"dpsql: {WHY_RHO}" if accounting == "zcdp" else \
        "dpsql: epsilon adds up (granted = spent + remaining)"


def budget_rows(budgets: list[Budget], accounting: str, delta: float | None) -> pa.Table:
    """Standings as every budget table shows them (``SHOW dpsql.budget``, ``budget show``).

    Under zCDP the figures are rho, each with its epsilon at ``delta`` beside it;
    under pure DP, epsilon. Four significant figures, rounded as :data:`ROUNDING`.
    """
    unit = "epsilon" if accounting == "pure" else "rho"
    columns: dict[str, pa.Array] = {
        "dataset": pa.array([b.dataset for b in budgets], pa.string()),
        "unit": pa.array([unit] * len(budgets), pa.string()),
    }
    for name, rounding in ROUNDING.items():
        costs = [getattr(b, name) for b in budgets]
        columns[name] = pa.array([_figure(c.value if not c.infinite else math.inf, rounding)
                                  for c in costs], pa.float64())
    if accounting == "zcdp":
        for name, rounding in ROUNDING.items():
            columns[f"{name}_epsilon"] = pa.array(
                [_figure(getattr(b, name).epsilon(delta or 0), rounding) for b in budgets],
                pa.float64())
        columns["delta"] = pa.array([delta] * len(budgets), pa.float64())
    return pa.table(columns)


def _figure(value: Fraction | float, rounding: Rounding) -> float:
    return float(figure(value, rounding))


def budget_table(ctx: Context) -> pa.Table:
    """The caller's budgets: one row per dataset."""
    policy = ctx.policy
    return budget_rows(ctx.ledger.budgets(ctx.user), policy.accounting, policy.delta)


def option_rows(ctx: Context, names: list[str]) -> pa.Table:
    """``SHOW`` for options: name, the value in force and where it comes from."""
    out: dict[str, list[str | None]] = {"name": [], "value": [], "source": []}
    for name in names:
        value = ctx.options.get(name)
        source = "session" if value is not None else "default"
        if value is None:
            value = _default(ctx, name)
        out["name"].append(f"dpsql.{name}")
        out["value"].append(value)
        out["source"].append(source)
    return pa.table({k: pa.array(v, pa.string()) for k, v in out.items()})


def _default(ctx: Context, name: str) -> str:
    policy = ctx.policy
    if name == "delta":
        return "" if policy.delta is None else f"{policy.delta:g}"
    if name == "ci":
        return "off" if confidence(ctx.options) is None else ""
    if name == "nonnegative_counts":
        return "off"
    if name == "target_error":
        return "unset"
    if name in ("epsilon", "rho"):
        if "rho" in ctx.options or "epsilon" in ctx.options:
            return ""
        defaults = [f"{d.name}: {d.default_query.describe(policy.delta)}"
                    for d in policy.datasets.values() if d.default_query is not None]
        return "policy default (" + "; ".join(defaults) + ")" if defaults else "unset"
    return ""


def all_options(ctx: Context) -> pa.Table:
    """``SHOW ALL``: every dpsql option."""
    return option_rows(ctx, list(OPTIONS))


def datasets_table(ctx: Context) -> pa.Table:
    """The public schema: every visible column of every dataset and its public domain."""
    rows: dict[str, list[Any]] = {k: [] for k in ("dataset", "column", "type", "domain",
                                                  "group_by")}
    for ds in ctx.policy.datasets.values():
        for col in ds.visible_columns:
            if col.open_keys:
                domain, group = "(no list: keys by DP partition selection)", col.name
            elif col.type == "categorical":
                values = [("NULL" if v is None else str(v)) for v in col.values or ()]
                domain = "{" + ", ".join(values[:12]) + (", ..." if len(values) > 12 else "") \
                    + "}"
                group = col.name
            else:
                assert col.bounds is not None
                domain = f"[{col.bounds[0]:g}, {col.bounds[1]:g}]"
                if col.edges is not None:
                    domain += f", {col.bins_text}"
                group = f"dp_bin({col.name}, WIDTH)"
                if col.edges is not None:
                    group = f"dp_bin({col.name})"
                    if col.type == "integer" and all(
                            b - a == 1 for a, b in zip(col.edges, col.edges[1:], strict=False)):
                        group = col.name
            rows["dataset"].append(ds.name)
            rows["column"].append(col.name)
            rows["type"].append(col.type + (" (nullable)" if col.nullable else ""))
            rows["domain"].append(domain)
            rows["group_by"].append(group)
    return pa.table({k: pa.array(v, pa.string()) for k, v in rows.items()})


def released_table(ctx: Context) -> pa.Table:
    """Released synthetic tables with their provenance summary."""
    from dpsql.imports import tables
    from dpsql.provenance import releases

    live = {r["name"]: r for r in releases(ctx.store)}
    names = ("table", "dataset", "synthesizer", "privacy", "released_at")
    rows = [(name, *(live[name][n] if name in live else None for n in names[1:]))
            for name in tables(ctx.store, SCHEMA)]
    return pa.table({n: pa.array([f"{SCHEMA}.{r[0]}" if i == 0 else
                                  (None if r[i] is None else str(r[i])) for r in rows],
                                 pa.string()) for i, n in enumerate(names)})


def jobs_table(ctx: Context) -> pa.Table:
    """Release jobs with their state and progress, newest first (administrators only).

    Analysts are refused: they release nothing, and the jobs name who released
    what and when.
    """
    from dpsql.jobs import COLUMNS, JOBS

    ctx.require_admin("list release jobs (SHOW dpsql.jobs)")
    rows = ctx.store[JOBS].list()
    types = {"id": pa.int64(), "fraction": pa.float64(), "audit_id": pa.int64(),
             "worker_pid": pa.int64()}
    return pa.table({c: pa.array([r[c] if c in types else None if r[c] is None else str(r[c])
                                  for r in rows], types.get(c, pa.string())) for c in COLUMNS})
