"""Tables answering statements about the session rather than the data.

``SHOW dpsql.<option>`` / ``SHOW ALL``, ``SHOW dpsql.budget`` and
``SELECT * FROM dpsql_budget()`` (the caller's own budgets), ``SHOW
dpsql.datasets`` (the public schema: columns and their domains) and ``SHOW
dpsql.released`` (released synthetic tables). Everything here is public
information or the caller's own standing; nothing reads sensitive rows.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dpsql.privacy import PrivacyCost
from dpsql.query.options import OPTIONS, confidence
from dpsql.query.released import SCHEMA

if TYPE_CHECKING:
    from dpsql.session import Session


def both_units(cost: PrivacyCost, delta: float | None, *, budget: bool = False) -> str:
    """A cost in both units: rho with its (epsilon, delta), or epsilon with its rho."""
    if cost.kind == "zcdp" or cost.infinite:
        return cost.describe(delta, budget=budget)
    rho = cost.to_zcdp().describe(budget=budget)
    return f"{cost.describe(budget=budget)} ({rho})"


def _value(cost: PrivacyCost) -> float:
    return math.inf if cost.infinite else float(cost.value)


def budget_table(session: Session) -> pa.Table:
    """The caller's budgets: one row per dataset."""
    policy = session.policy
    unit = "epsilon" if policy.accounting == "pure" else "rho"
    rows: dict[str, list[Any]] = {k: [] for k in (
        "dataset", "unit", "granted", "spent", "remaining", "remaining_epsilon", "delta")}
    for standing in session.ledger.budgets(session.user):
        remaining = standing.remaining
        rows["dataset"].append(standing.dataset)
        rows["unit"].append(unit)
        rows["granted"].append(_value(standing.granted))
        rows["spent"].append(_value(standing.spent))
        rows["remaining"].append(_value(remaining))
        rows["remaining_epsilon"].append(remaining.epsilon(policy.delta or 0)
                                         if policy.accounting == "zcdp" else _value(remaining))
        rows["delta"].append(policy.delta)
    return pa.table({
        "dataset": pa.array(rows["dataset"], pa.string()),
        "unit": pa.array(rows["unit"], pa.string()),
        "granted": pa.array(rows["granted"], pa.float64()),
        "spent": pa.array(rows["spent"], pa.float64()),
        "remaining": pa.array(rows["remaining"], pa.float64()),
        "remaining_epsilon": pa.array(rows["remaining_epsilon"], pa.float64()),
        "delta": pa.array(rows["delta"], pa.float64()),
    })


def option_rows(session: Session, names: list[str]) -> pa.Table:
    """``SHOW`` for options: name, the value in force and where it comes from."""
    out: dict[str, list[str | None]] = {"name": [], "value": [], "source": []}
    for name in names:
        value = session.options.get(name)
        source = "session" if value is not None else "default"
        if value is None:
            value = _default(session, name)
        out["name"].append(f"dpsql.{name}")
        out["value"].append(value)
        out["source"].append(source)
    return pa.table({k: pa.array(v, pa.string()) for k, v in out.items()})


def _default(session: Session, name: str) -> str:
    policy = session.policy
    if name == "delta":
        return "" if policy.delta is None else f"{policy.delta:g}"
    if name == "ci":
        return "off" if confidence(session.options) is None else ""
    if name in ("epsilon", "rho"):
        if "rho" in session.options or "epsilon" in session.options:
            return ""
        defaults = [f"{d.name}: {d.default_query.describe(policy.delta)}"
                    for d in policy.datasets.values() if d.default_query is not None]
        return "policy default (" + "; ".join(defaults) + ")" if defaults else "unset"
    return ""


def all_options(session: Session) -> pa.Table:
    """``SHOW ALL``: every dpsql option."""
    return option_rows(session, list(OPTIONS))


def datasets_table(session: Session) -> pa.Table:
    """The public schema: every visible column of every dataset and its public domain."""
    rows: dict[str, list[Any]] = {k: [] for k in ("dataset", "column", "type", "domain",
                                                  "group_by")}
    for ds in session.policy.datasets.values():
        for col in ds.visible_columns:
            if col.type == "categorical":
                values = [("NULL" if v is None else str(v)) for v in col.values or ()]
                domain = "{" + ", ".join(values[:12]) + (", ..." if len(values) > 12 else "") \
                    + "}"
                group = col.name
            else:
                assert col.bounds is not None
                domain = f"[{col.bounds[0]:g}, {col.bounds[1]:g}]"
                if col.edges is not None:
                    domain += f", {len(col.edges) - 1} bins"
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


def released_table(session: Session) -> pa.Table:
    """Released synthetic tables with their provenance summary."""
    cur = session.store.cursor()
    rows = cur.execute(
        "SELECT t.table_name, r.dataset, r.synthesizer, r.privacy, r.released_at "
        "FROM information_schema.tables t LEFT JOIN dpsql.releases r "
        "ON r.name = t.table_name AND r.superseded_by IS NULL "
        "WHERE t.table_schema = ? ORDER BY t.table_name", [SCHEMA]).fetchall()
    names = ("table", "dataset", "synthesizer", "privacy", "released_at")
    return pa.table({n: pa.array([f"{SCHEMA}.{r[0]}" if i == 0 else
                                  (None if r[i] is None else str(r[i])) for r in rows],
                                 pa.string()) for i, n in enumerate(names)})
