"""Analyst SELECT (sqlglot AST) -> QueryPlan, over an allowlist of constructs.

Accepted: ``COUNT(*)``, ``COUNT(col)``, ``COUNT(DISTINCT col)``, ``SUM(col)``,
``AVG(col)``, the variances and standard deviations, the quantiles (``MEDIAN``,
``PERCENTILE_CONT``, ``QUANTILE_CONT``, ``MIN``, ``MAX``)
(:mod:`dpsql.query.aggregates`; optionally with ``FILTER (WHERE ...)``) and
arithmetic on them; GROUP BY public keys (:mod:`dpsql.query.keys`); a JOIN of
one public table on its key (:mod:`dpsql.query.joins`); WHERE row
predicates (:mod:`dpsql.query.predicates`); HAVING, ORDER BY, LIMIT and OFFSET
as post-processing; GoogleSQL's
``WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = ..., delta = ...)``. Everything
else raises QueryRejected naming the construct, its line and column and what to
write instead. Nothing here runs SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.errors import QueryRejected
from dpsql.policy import Column, Dataset, Policy, did_you_mean
from dpsql.query.aggregates import Aggregates
from dpsql.query.dialect import (
    DPOptions,
    describe,
    keyword_start,
    nested_too_deeply,
    reject,
    unparen,
)
from dpsql.query.joins import PublicCatalog, check_join, public_key
from dpsql.query.keys import check_cells, policy_bins_key, value_key, width_key
from dpsql.query.literals import Type, read_number
from dpsql.query.model import GroupKey, Join, Measure, Order, Output, QueryPlan
from dpsql.query.postcheck import AGGREGATE_NODES, PostChecker, is_dp_bin
from dpsql.query.predicates import RowChecker, RowScope
from dpsql.query.selection import COUNT_ROWS

_SELECT_ARGS = {"expressions", "from_", "joins", "where", "group", "having", "order", "limit",
                "offset", "hint"}
_CLAUSE_NAMES = {
    "distinct": ("DISTINCT", "DISTINCT reveals which values occur; use GROUP BY with COUNT(*)"),
    "with_": ("WITH (common table expression)", "write one query over one dataset"),
    "laterals": ("LATERAL", "query one dataset"),
    "qualify": ("QUALIFY", "window functions are not supported; filter groups with HAVING"),
    "windows": ("WINDOW", "window functions are not supported in DP queries"),
    "into": ("SELECT INTO", "queries cannot write tables"),
    "sample": ("SAMPLE", "sampling is not supported; the policy bounds contributions"),
    "pivots": ("PIVOT", "use GROUP BY"),
}
DP_OPTIONS = ("epsilon", "delta", "rho")
def _int_literal(node: exp.Expr | None) -> int | None:
    if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
        return int(node.this)
    return None


class _Planner:
    """Builds one QueryPlan; keeps the keys and aggregates found so far."""

    def __init__(self, text: str, policy: Policy,
                 types_of: Callable[[Dataset], Mapping[str, str]],
                 catalog: PublicCatalog | None = None) -> None:
        self.text = text
        self.policy = policy
        self.types_of = types_of
        self.catalog = catalog
        self.join: Join | None = None
        self.public_keys: dict[str, Column] = {}
        self.keys: list[GroupKey] = []
        self.key_sigs: list[tuple[Any, ...]] = []
        self.key_types: list[Type] = []

    # -- entry --------------------------------------------------------------------------
    def plan(self, ast: exp.Expr) -> QueryPlan:
        select = self._root(ast)
        if select.args.get("from_") is not None:
            self.dataset = self._dataset(select)
        self._forbid(select)
        if select.args.get("from_") is None:
            self.dataset = self._dataset(select)
        options = self._options(select.args.get("hint"))
        where = select.args.get("where")
        predicate = self.rows.predicate(where.this, "WHERE") if where is not None else None
        items = self._items(select)
        self._group(select, items)
        outputs = self._outputs(items)
        aliases = {o.name.lower(): (o.expr, t) for o, t in outputs}
        post = PostChecker(self, aliases)
        having = select.args.get("having")
        having_expr = post.predicate(having.this, "HAVING") if having is not None else None
        order = self._order(select, [o for o, _ in outputs], post)
        limit, offset = self._limits(select)
        measures = tuple(self.aggs.measures)
        if any(k.mode == "selected" for k in self.keys):
            measures = self._selecting(measures, select)
        return QueryPlan(
            dataset=self.dataset, keys=tuple(self.keys), measures=measures,
            aggregates=tuple(self.aggs.aggregates), where=predicate,
            outputs=tuple(o for o, _ in outputs), having=having_expr, order=tuple(order),
            limit=limit, offset=offset, options=options,
            join=replace(self.join, keys=tuple(self.public_keys.values())) if self.join else None)

    # -- structure ----------------------------------------------------------------------
    def _root(self, ast: exp.Expr) -> exp.Select:
        if isinstance(ast, exp.SetOperation):
            name = describe(ast)
            where = keyword_start(self.text, "UNION", "INTERSECT", "EXCEPT")
            raise reject(self.text, f"{name} is not allowed in DP queries",
                         ast if where is None else where, construct=name,
                         advice="ask each query separately")
        if isinstance(ast, exp.Subquery):
            raise reject(self.text, "a parenthesized query is not allowed", ast,
                         construct="subquery", advice="write the SELECT without parentheses")
        if not isinstance(ast, exp.Select):
            raise reject(self.text, f"{describe(ast)} is not a query", ast,
                         construct=describe(ast), advice="write a SELECT")
        for arg, value in ast.args.items():
            if value in (None, False, []) or arg in _SELECT_ARGS:
                continue
            name, advice = _CLAUSE_NAMES.get(arg, (arg.upper().rstrip("_"),
                                                   "see docs/sql.md for the accepted SQL"))
            first = value[0] if isinstance(value, list) else value
            node = first if isinstance(first, exp.Expr) else ast
            raise reject(self.text, f"{name} is not allowed in DP queries", node,
                         construct=name, advice=advice)
        return ast

    def _forbid(self, select: exp.Select) -> None:
        """Constructs refused wherever they appear in a DP query."""
        for node in select.walk():
            if node is select:
                continue
            if isinstance(node, (exp.Select, exp.Subquery, exp.Exists, exp.SetOperation)):
                raise reject(self.text, "subqueries are not allowed in DP queries", node,
                             construct="subquery", advice="write one query over one dataset")
            if isinstance(node, exp.Window):
                raise reject(self.text, "window functions are not allowed in DP queries", node,
                             construct="window function (OVER)",
                             advice="use GROUP BY for per-group aggregates")
            if isinstance(node, exp.Join) and node.parent is select:
                continue  # the public-table join, checked by _join
            if isinstance(node, (exp.Join, exp.Lateral)):
                raise reject(self.text, "joins are not allowed in DP queries", node,
                             construct="JOIN", advice="query one dataset at a time")
            if isinstance(node, (exp.Placeholder, exp.Parameter)):
                raise reject(self.text, "query parameters are not supported", node,
                             construct="parameter", advice="write the values into the query")
            if isinstance(node, exp.Star) and not isinstance(node.parent, exp.Count):
                raise reject(self.text, "SELECT * would return raw rows", node,
                             construct="SELECT *", advice="select aggregates such as COUNT(*)")
            if isinstance(node, DPOptions) and node.parent is not select:
                raise reject(self.text, "WITH DIFFERENTIAL_PRIVACY goes right after the first "
                             "SELECT", node, construct="WITH DIFFERENTIAL_PRIVACY")

    def _dataset(self, select: exp.Select) -> Dataset:
        source = select.args.get("from_")
        if source is None:
            raise reject(self.text, "a DP query needs FROM <dataset>", select, construct="FROM",
                         advice=f"datasets: {', '.join(self.policy.datasets)}")
        table = source.this
        if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
            what = describe(table.this if isinstance(table, exp.Table) else table)
            raise reject(self.text, f"{what} is not allowed in FROM", table, construct=what,
                         advice="read a dataset by name; table functions and subqueries are "
                         "not allowed")
        for arg in ("joins", "laterals", "pivots", "sample", "version", "when", "changes"):
            if table.args.get(arg):
                raise reject(self.text, f"{arg.upper()} on a table is not allowed", table,
                             construct=arg.upper(), advice="read the dataset by name")
        if table.args.get("catalog") or (table.db and table.db.lower() != "main"):
            raise reject(self.text, f"unknown table {table.sql()}", table, construct="table",
                         advice=f"datasets: {', '.join(self.policy.datasets)}; released "
                         "tables are read as released.<name>")
        name = table.name.lower()
        found = [d for d in self.policy.datasets.values() if d.name.lower() == name] or \
            [d for d in self.policy.datasets.values() if d.table.lower() == name]
        if not found:
            raise reject(self.text, f"unknown dataset {table.name!r}"
                         f"{did_you_mean(table.name, list(self.policy.datasets))}", table,
                         construct="table", advice="datasets: "
                         + ", ".join(self.policy.datasets))
        dataset = found[0]
        alias = table.args.get("alias")
        if alias is not None and alias.args.get("columns"):
            raise reject(self.text, "column aliases on the table are not allowed", alias,
                         construct="table alias", advice="alias columns in the SELECT list")
        qualifiers = {dataset.name.lower(), dataset.table.lower()}
        if alias is not None:
            qualifiers = {alias.name.lower()}
        types = self.types_of(dataset)
        self.scope = RowScope(self.text, dataset, types, frozenset(qualifiers))
        if select.args.get("joins"):
            self.scope, self.join = check_join(self.text, self.policy, self.scope,
                                               select.args["joins"], self.catalog)
        self.rows = RowChecker(self.scope)
        self.aggs = Aggregates(self.text, self.scope, self.rows)
        self.column_names = {c.lower() for c in dataset.columns}
        return dataset

    def _options(self, hint: exp.Expr | None) -> dict[str, str]:
        if hint is None:
            return {}
        if not isinstance(hint, DPOptions):
            raise reject(self.text, "query hints are not allowed", hint, construct="hint")
        options: dict[str, str] = {}
        for item in hint.expressions:
            value = item.expression if isinstance(item, exp.EQ) else None
            if not isinstance(item, exp.EQ) or not isinstance(item.this, exp.Column):
                raise reject(self.text, "OPTIONS takes name = value pairs", item,
                             construct="OPTIONS", advice="OPTIONS (epsilon = 0.5, delta = 1e-7)")
            name = item.this.name.lower()
            if name not in DP_OPTIONS:
                raise reject(self.text, f"option {name} is not accepted", item,
                             construct="OPTIONS", advice="give epsilon (and delta) or rho; "
                             "the privacy unit and contribution bounds come from the policy")
            if not (isinstance(value, exp.Literal) and not value.is_string):
                raise reject(self.text, f"option {name} needs a number", item,
                             construct="OPTIONS", advice=f"OPTIONS ({name} = 0.5)")
            options[name] = read_number(value, self.text).text
            amount = Fraction(options[name])
            if (amount < 0 or amount >= 1) if name == "delta" else amount <= 0:
                raise reject(self.text, f"option {name} must be " + (
                    "at least 0 and below 1" if name == "delta" else "greater than 0"), item,
                    construct="OPTIONS", advice=f"OPTIONS ({name} = "
                    f"{'1e-7' if name == 'delta' else '0.5'})")
        return options

    # -- SELECT list and GROUP BY ----------------------------------------------------------
    def _items(self, select: exp.Select) -> list[tuple[exp.Expr, str | None]]:
        items: list[tuple[exp.Expr, str | None]] = []
        for item in select.expressions:
            if isinstance(item, exp.Alias):
                items.append((item.this, item.alias))
            else:
                items.append((item, None))
        return items

    def _signature(self, node: exp.Expr) -> tuple[tuple[Any, ...], Column, exp.Expr] | None:
        node = unparen(node)
        if isinstance(node, exp.Column):
            col = self.scope.column(node)
            return ("value", col.name, None), col, node
        call = is_dp_bin(node)
        if call is None:
            return None
        args = call.expressions
        if not args or len(args) > 2 or not isinstance(args[0], exp.Column):
            raise reject(self.text, "dp_bin takes a column and an optional width", node,
                         construct="dp_bin", advice="write dp_bin(age, 10) or dp_bin(age)")
        col = self.scope.column(args[0])
        if len(args) == 1:
            return ("policy_bins", col.name, None), col, call
        width = args[1]
        text = width.this if isinstance(width, exp.Literal) else width.sql()
        return ("width", col.name, text), col, call

    def key_index(self, node: exp.Expr) -> int | None:
        """The GROUP BY key ``node`` denotes, if any."""
        node = unparen(node)
        if not isinstance(node, exp.Column) and is_dp_bin(node) is None:
            return None
        found = self._signature(node)
        if found is None:
            return None
        signature, col, _ = found
        if signature[0] == "width":
            key = width_key(col, unparen(is_dp_bin(node).expressions[1]),  # type: ignore[union-attr]
                            self.text, node)
            signature = ("width", col.name, key.width)
        return self.key_sigs.index(signature) if signature in self.key_sigs else None

    def _group(self, select: exp.Select, items: list[tuple[exp.Expr, str | None]]) -> None:
        group = select.args.get("group")
        if group is None:
            return
        for arg in ("grouping_sets", "cube", "rollup", "totals"):
            if group.args.get(arg):
                raise reject(self.text, f"{arg.upper().replace('_', ' ')} is not allowed", group,
                             construct=arg.upper(), advice="GROUP BY a list of keys")
        for node in group.expressions:
            if isinstance(node, (exp.GroupingSets, exp.Cube, exp.Rollup)):
                name = {exp.GroupingSets: "GROUPING SETS", exp.Cube: "CUBE",
                        exp.Rollup: "ROLLUP"}[type(node)]
                raise reject(self.text, f"{name} is not allowed", node, construct=name,
                             advice="ask one GROUP BY per query")
        nodes = list(group.expressions)
        if group.args.get("all"):
            nodes = [e for e, _ in items if not any(isinstance(n, AGGREGATE_NODES)
                                                    for n in e.walk())]
        aliases = {a.lower(): e for e, a in items if a}
        for node in nodes:
            position = _int_literal(node)
            if position is not None:
                if not 1 <= position <= len(items):
                    raise reject(self.text, f"GROUP BY {position}: the SELECT list has "
                                 f"{len(items)} items", node, construct="GROUP BY")
                node = items[position - 1][0]
            elif isinstance(node, exp.Column) and not node.table \
                    and node.name.lower() in aliases \
                    and node.name.lower() not in self.column_names:
                node = aliases[node.name.lower()]
            self._add_key(node)
        check_cells(self.keys, self.text, group)

    def _add_key(self, node: exp.Expr) -> None:
        found = self._signature(node)
        if found is None:
            name = describe(unparen(node))
            if any(isinstance(n, AGGREGATE_NODES) for n in node.walk()):
                raise reject(self.text, "cannot GROUP BY an aggregate", node,
                             construct="GROUP BY", advice="group by columns or dp_bin(...)")
            raise reject(self.text, f"GROUP BY {name} has no public key set", node,
                         construct=f"GROUP BY {name}",
                         advice="group by a categorical column or dp_bin(col, WIDTH) of a "
                         "bounded column")
        signature, col, call = found
        if self.scope.public is not None and self.scope.public.holds(col):
            if signature[0] != "value":
                raise reject(self.text, f"dp_bin of public column {col.name}", node,
                             construct="dp_bin", advice=f"GROUP BY {col.name} itself: its "
                             "values come from the public table")
            assert self.join is not None
            assert self.catalog is not None
            if col.name not in self.public_keys:
                self.public_keys[col.name] = public_key(col, self.join, self.catalog)
            col = self.public_keys[col.name]
        if signature[0] == "value" and col.open_keys:
            key = GroupKey(col.name, "selected", ())
        elif signature[0] == "value":
            key = value_key(col, self.text, node)
        elif signature[0] == "policy_bins":
            key = policy_bins_key(col, self.text, node)
        else:
            key = width_key(col, unparen(call.expressions[1]), self.text, node)
            signature = ("width", col.name, key.width)
        if signature in self.key_sigs:
            return
        self.keys.append(key)
        self.key_sigs.append(signature)
        self.key_types.append(self.scope.type_of(col) if key.mode in ("value", "selected")
                              else "num")

    def _selecting(self, measures: tuple[Measure, ...], select: exp.Select
                   ) -> tuple[Measure, ...]:
        """The measures of a query whose key is selected privately, with its COUNT(*) added.

        Refuses what partition selection cannot serve: another GROUP BY key, a
        quantile (its noise is per public cell), a policy with no delta.
        """
        key = next(k for k in self.keys if k.mode == "selected")
        group = select.args["group"]
        if len(self.keys) > 1:
            raise reject(self.text, f"GROUP BY {key.column} (no value list) with other keys",
                         group, construct=f"GROUP BY {key.column}",
                         advice=f"group by {key.column} alone, or declare its values in the "
                         "policy")
        if any(m.kind == "quantile" for m in measures):
            raise reject(self.text, f"a quantile by {key.column}, whose keys have no value list",
                         group, construct=f"GROUP BY {key.column}",
                         advice="ask COUNT, SUM, AVG or the spread family by it")
        if self.policy.accounting != "zcdp":
            raise reject(self.text, f"column {key.column!r} has no value list, so its keys "
                         "would be chosen by DP partition selection, which costs a delta; this "
                         "policy's accounting is pure (no delta)", group,
                         construct=f"GROUP BY {key.column}",
                         advice=f"declare values: [...] for {key.column} in the policy, or ask "
                         "an administrator for accounting: zcdp with a delta")
        return measures if COUNT_ROWS in measures else (*measures, COUNT_ROWS)

    def _outputs(self, items: list[tuple[exp.Expr, str | None]]) -> list[tuple[Output, Type]]:
        post = PostChecker(self, {})
        outputs: list[tuple[Output, Type]] = []
        used: set[str] = set()
        for node, alias in items:
            if isinstance(node, exp.Star):
                raise reject(self.text, "SELECT * would return raw rows", node,
                             construct="SELECT *", advice="select aggregates such as COUNT(*)")
            expr, kind = post.check(node)
            aggregate = key = None
            if isinstance(expr, exp.Column) and expr.name.startswith("_a"):
                aggregate = int(expr.name[2:])
            elif isinstance(expr, exp.Column) and expr.name.startswith("_k"):
                key = int(expr.name[2:])
            name = alias or self._default_name(node, aggregate, key, len(outputs))
            base, n = name, 2
            while name.lower() in used:
                name, n = f"{base}_{n}", n + 1
            used.add(name.lower())
            outputs.append((Output(name, expr, aggregate, key), kind))
        return outputs

    def _default_name(self, node: exp.Expr, aggregate: int | None, key: int | None,
                      index: int) -> str:
        if aggregate is not None:
            return self.aggs.aggregates[aggregate].default_name
        if key is not None:
            k = self.keys[key]
            name = k.column.split(".")[-1]  # a public column is named <table>.<column>
            return name if k.mode in ("value", "selected") else f"{name}_bin"
        return f"col{index + 1}"

    # -- ORDER BY, LIMIT ---------------------------------------------------------------------
    def _order(self, select: exp.Select, outputs: list[Output],
               post: PostChecker) -> list[Order]:
        order = select.args.get("order")
        if order is None:
            return []
        by_name = {o.name.lower(): o for o in outputs}
        out = []
        for item in order.expressions:
            node = item.this if isinstance(item, exp.Ordered) else item
            position = _int_literal(node)
            if position is not None:
                if not 1 <= position <= len(outputs):
                    raise reject(self.text, f"ORDER BY {position}: the SELECT list has "
                                 f"{len(outputs)} items", node, construct="ORDER BY")
                expr = outputs[position - 1].expr
            elif isinstance(node, exp.Column) and not node.table \
                    and node.name.lower() in by_name:
                expr = by_name[node.name.lower()].expr
            elif isinstance(node, (exp.Literal, exp.Null, exp.Boolean)) \
                    or not any(True for _ in node.find_all(exp.Column, exp.AggFunc)):
                raise reject(self.text, "ORDER BY a constant has no effect", node,
                             construct="ORDER BY", advice="order by a column position "
                             "(ORDER BY 1), a key, an alias or an aggregate")
            else:
                expr, _ = post.check(node)
            desc = bool(item.args.get("desc")) if isinstance(item, exp.Ordered) else False
            nulls = item.args.get("nulls_first") if isinstance(item, exp.Ordered) else None
            out.append(Order(expr, desc, nulls))
        return out

    def _limits(self, select: exp.Select) -> tuple[int | None, int | None]:
        values: list[int | None] = []
        for arg in ("limit", "offset"):
            clause = select.args.get(arg)
            if clause is None:
                values.append(None)
                continue
            extra = [k for k, v in clause.args.items() if k != "expression" and v]
            expression = clause.args.get("expression")
            number = _int_literal(expression)
            if number is None or extra:
                negative = isinstance(expression, exp.Neg) and _int_literal(expression.this)
                raise reject(self.text, f"{arg.upper()} " + (
                    "cannot be negative" if negative else "takes a whole number"), clause,
                    construct=arg.upper(), advice=f"write {arg.upper()} 10")
            if number >= 2**63:  # as PostgreSQL: a BIGINT, so slicing the answer cannot fail
                raise reject(self.text, f"{arg.upper()} {number} is out of range", clause,
                             construct=arg.upper(), advice=f"write {arg.upper()} at most "
                             "9223372036854775807 (or leave it out)")
            values.append(number)
        return values[0], values[1]


def plan_query(ast: exp.Expr, text: str, policy: Policy,
               types_of: Callable[[Dataset], Mapping[str, str]],
               catalog: PublicCatalog | None = None) -> QueryPlan:
    """Validate the DP query ``ast`` (parsed from ``text``) into a QueryPlan.

    ``types_of(dataset)`` gives the DuckDB type of each column of the dataset's
    table (public schema information). Raises QueryRejected for anything outside
    the allowlist. ``catalog`` reads the policy's public tables, for joins.
    """
    try:
        return _Planner(text, policy, types_of, catalog).plan(ast)
    except QueryRejected:
        raise
    except RecursionError:
        raise nested_too_deeply() from None
