"""The expressions of SELECT, HAVING and ORDER BY: keys, aggregates, literals, arithmetic.

What they may name: a GROUP BY key, an aggregate (measured and paid for like
any other), an output alias, literals and the row checker's operators over
them. A column outside an aggregate that is not a key is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from sqlglot import exp

from dpsql.query.aggregates import Aggregates
from dpsql.query.dialect import reject
from dpsql.query.literals import Type
from dpsql.query.predicates import RowChecker, RowScope

#: Nodes that are one aggregate call (``PERCENTILE_CONT(q) WITHIN GROUP (...)`` is a WithinGroup).
AGGREGATE_NODES = (exp.AggFunc, exp.Filter, exp.WithinGroup)


def is_dp_bin(node: exp.Expr) -> exp.Anonymous | None:
    """The ``dp_bin(...)`` call in ``node`` (bare or as ``udfs.dp_bin``), else None."""
    if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) \
            and node.this.name.lower() == "udfs":
        node = node.expression
    if isinstance(node, exp.Anonymous) and node.name.lower() == "dp_bin":
        return node
    return None



class Keys(Protocol):
    """What the planner knows so far that post-processing may name."""

    scope: RowScope
    aggs: Aggregates
    key_types: list[Type]
    column_names: set[str]

    def key_index(self, node: exp.Expr) -> int | None:
        """The GROUP BY key ``node`` is, if it is one."""


class PostChecker(RowChecker):
    """Expressions of SELECT, HAVING and ORDER BY: keys, aggregates, literals, arithmetic."""

    context = "SELECT, HAVING and ORDER BY"
    advice = ("select GROUP BY keys, aggregates (COUNT, SUM, AVG, VAR_POP, MEDIAN, ...) "
              "and arithmetic on them; "
              "see docs/sql.md")

    def __init__(self, planner: Keys, aliases: Mapping[str, tuple[exp.Expr, Type]]) -> None:
        super().__init__(planner.scope)
        self.planner = planner
        self.aliases = aliases

    def check(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        """An aggregate, alias or key as its column of the noisy cells; else the row checker's."""
        if isinstance(node, AGGREGATE_NODES):
            return exp.column(f"_a{self.planner.aggs.add(node)}"), "num"
        if isinstance(node, exp.Column) and not node.table:
            alias = self.aliases.get(node.name.lower())
            if alias is not None and node.name.lower() not in self.planner.column_names:
                return alias
        key = self.planner.key_index(node)
        if key is not None:
            return exp.column(f"_k{key}"), self.planner.key_types[key]
        if isinstance(node, exp.Column) or is_dp_bin(node) is not None:
            col = self.scope.column(node) if isinstance(node, exp.Column) else None
            name = col.name if col else node.sql()
            raise reject(self.source, f"{name} is used outside an aggregate but is not a "
                         "GROUP BY key", node, construct=f"private column {name}",
                         advice="aggregate it (COUNT, SUM, AVG) or add it to GROUP BY")
        return super().check(node)
