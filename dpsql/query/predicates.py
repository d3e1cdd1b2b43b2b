"""Row-level expressions (WHERE, FILTER): validated against an allowlist and made total.

A row predicate may only read visible columns of the dataset and literals,
through comparisons, BETWEEN, IN (literal lists), IS [NOT] NULL, LIKE/ILIKE,
AND/OR/NOT, arithmetic and a few scalar functions. Every construct is
type-checked here so that the generated SQL cannot fail on some row: a failure
would reveal something about the data (a bad cast, an overflow, a division by
zero), and it would come after the charge. Arithmetic on columns is therefore
done in DOUBLE, where DuckDB never raises, and arithmetic on literals alone is
folded here, exactly: DuckDB never sees it, and a constant that overflows BIGINT
or DOUBLE, or divides by zero, is refused before any charge.

Privacy: a row predicate is a function of one row, so filtering before
aggregation does not change any sensitivity.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlglot import exp

from dpsql.errors import QueryRejected
from dpsql.policy import Column, Dataset, did_you_mean
from dpsql.query.dialect import describe, reject
from dpsql.query.literals import Folder, Type, sql_type, total_numeric

_TYPE_NAMES = {"num": "number", "str": "text", "bool": "boolean"}

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ,
                exp.NullSafeNEQ)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div)
NONDETERMINISTIC = frozenset({
    "rand", "random", "uuid", "gen_random_uuid", "uuidv4", "uuidv7", "now", "setseed",
    "current_date", "current_time", "current_timestamp", "currenttimestamp", "currentdate",
    "currenttime", "get_current_time", "get_current_timestamp", "transaction_timestamp",
    "nextval", "currval", "today",
})


@dataclass(frozen=True)
class PublicScope:
    """The columns of a joined public table, named ``<table>.<column>`` in row expressions."""

    table: str
    qualifiers: frozenset[str]
    columns: tuple[str, ...]

    def find(self, name: str) -> Column | None:
        """The public column ``name`` (any case) as a categorical column, or None."""
        for column in self.columns:
            if column.lower() == name.lower():
                return Column(f"{self.table}.{column}", "categorical", nullable=True)
        return None

    def holds(self, col: Column) -> bool:
        """Whether ``col`` is one of this table's columns."""
        return col.name.startswith(f"{self.table}.")


@dataclass
class RowScope:
    """Names a row expression may use: the dataset's visible columns under its table names.

    With a join, also the public table's columns (their types are in ``types``
    under ``<table>.<column>``).
    """

    source: str
    dataset: Dataset
    types: Mapping[str, str]
    qualifiers: frozenset[str]
    public: PublicScope | None = None

    def column(self, node: exp.Column) -> Column:
        """Resolve a column reference; hidden and unknown columns are rejected."""
        if node.args.get("catalog") or node.args.get("db"):
            raise reject(self.source, f"unknown column {node.sql()}", node, construct="column",
                         advice=f"refer to columns of {self.dataset.name} by name")
        table = node.table
        public = self.public
        if public is not None and table and table.lower() in public.qualifiers:
            found = public.find(node.name)
            if found is None:
                raise reject(self.source, f"unknown column {node.name!r} in public table "
                             f"{public.table}", node, construct="column",
                             advice="columns: " + ", ".join(public.columns))
            return found
        if table and table.lower() not in self.qualifiers:
            raise reject(self.source, f"unknown table {table!r} in {node.sql()}", node,
                         construct="column", advice=f"the query reads only {self.dataset.name}"
                         + (f" and {public.table}" if public is not None else ""))
        name = node.name
        columns = {c.lower(): c for c in self.dataset.columns}
        col = self.dataset.columns.get(columns.get(name.lower(), name))
        if public is not None and not table and public.find(name) is not None:
            if col is not None:
                raise reject(self.source, f"column {name!r} is in both {self.dataset.name} "
                             f"and {public.table}", node, construct="ambiguous column",
                             advice=f"qualify it: {public.table}.{name} or "
                             f"{self.dataset.name}.{name} (or the tables' aliases)")
            return public.find(name)  # type: ignore[return-value]
        if col is None or col.name not in self.types:
            visible = [c.name for c in self.dataset.visible_columns]
            raise reject(self.source, f"unknown column {name!r} in {self.dataset.name}"
                         f"{did_you_mean(name, visible)}", node, construct="column",
                         advice="columns: " + ", ".join(visible))
        if col.hidden:
            raise reject(self.source, f"column {col.name!r} is hidden by the policy", node,
                         construct="hidden column",
                         advice="hidden columns cannot be used anywhere in a query")
        return col

    def type_of(self, col: Column) -> Type:
        """The predicate type class of a resolved column."""
        return sql_type(self.types[col.name])

    def measured(self, node: exp.Column) -> Column:
        """A column an aggregate may measure: a dataset column, never a public one.

        A public column's values are no private data, but a sum of them weighs each
        private row by a value from another table, whose bounds the policy never states.
        """
        col = self.column(node)
        if self.public is not None and self.public.holds(col):
            raise reject(self.source, f"aggregating public column {col.name} is not supported",
                         node, construct="aggregate of a public column",
                         advice=f"aggregate columns of {self.dataset.name}; group by or filter "
                         f"on {self.public.table}'s columns")
        return col


class RowChecker:
    """Validate a row-level expression and return a total rewrite of it with its type."""

    context = "row conditions (WHERE, FILTER)"
    advice = ("use comparisons, BETWEEN, IN, IS NULL, LIKE, AND/OR/NOT and arithmetic on "
              "columns and literals")

    def __init__(self, scope: RowScope) -> None:
        self.scope = scope
        self.source = scope.source
        self.folder = Folder(scope.source)
        handlers: dict[type, Callable[[exp.Expr], tuple[exp.Expr, Type]]] = {
            exp.Column: self._column, exp.Literal: self._literal, exp.Null: self._null,
            exp.Boolean: self._boolean, exp.Paren: self._paren, exp.Neg: self._neg,
            exp.Not: self._not, exp.And: self._logic, exp.Or: self._logic,
            exp.Between: self._between, exp.In: self._in, exp.Is: self._is,
            exp.Like: self._like, exp.ILike: self._like, exp.Escape: self._escape,
            exp.Abs: self._abs, exp.Round: self._round, exp.Lower: self._string_fn,
            exp.Upper: self._string_fn, exp.Length: self._length, exp.Coalesce: self._coalesce,
        }
        self.handlers = handlers

    def predicate(self, node: exp.Expr, where: str) -> exp.Expr:
        """A boolean row predicate (WHERE or FILTER)."""
        rewritten, kind = self.check(node)
        if kind not in ("bool", "null"):
            raise reject(self.source, f"{where} needs a true/false condition", node,
                         construct=where, advice="compare a column with a value, e.g. age > 30")
        return rewritten

    def check(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        """The total rewrite of ``node`` and its type, or QueryRejected."""
        constant = self.folder.constant(node)
        if constant is not None:
            return constant.sql(), "num"
        handler = self.handlers.get(type(node))
        if handler is not None:
            return handler(node)
        if isinstance(node, _COMPARISONS):
            return self._compare(node)
        if isinstance(node, _ARITHMETIC):
            return self._arith(node)
        raise self._refuse(node)

    # -- refusals ---------------------------------------------------------------------
    def _refuse(self, node: exp.Expr) -> QueryRejected:
        name = describe(node)
        if isinstance(node, exp.AggFunc):
            return reject(self.source, f"aggregate {name} in {self.context}", node,
                          construct=name, advice="filter on aggregates with HAVING")
        if isinstance(node, (exp.Select, exp.Subquery, exp.Exists)):
            return reject(self.source, "subqueries are not allowed", node, construct="subquery",
                          advice="write one query over one dataset")
        if isinstance(node, exp.Func) and name.split()[-1] in NONDETERMINISTIC:
            return reject(self.source, f"{name} is not deterministic", node, construct=name,
                          advice="a DP query may only use deterministic expressions")
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return reject(self.source, f"CAST is not allowed in {self.context}", node,
                          construct="CAST", advice="compare the column with a literal of its "
                          "type (a number or a quoted string)")
        if isinstance(node, exp.Func):
            return reject(self.source, f"{name} is not allowed in {self.context}", node,
                          construct=name, advice="allowed functions: abs, round, lower, upper, "
                          "length, coalesce (and COUNT, SUM, AVG as aggregates); see "
                          "docs/sql.md")
        return reject(self.source, f"{name} is not allowed in {self.context}", node,
                      construct=name, advice=self.advice)

    def _same(self, node: exp.Expr, kinds: list[Type], what: str) -> Type:
        """The common type of ``kinds`` (NULL fits anything); mismatches are rejected."""
        real = {k for k in kinds if k != "null"}
        if "other" in real:
            raise reject(self.source, f"{what}: this column type cannot be compared", node,
                         construct=what, advice="only numbers, text and booleans can be "
                         "compared; IS NULL works on any column")
        if len(real) > 1:
            names = sorted(_TYPE_NAMES.get(k, k) for k in real)
            raise reject(self.source, f"{what} mixes {' and '.join(names)} values", node,
                         construct=what, advice="compare numbers with numbers and text with "
                         "quoted strings")
        return real.pop() if real else "null"

    # -- leaves -----------------------------------------------------------------------
    def _column(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        assert isinstance(node, exp.Column)
        col = self.scope.column(node)
        kind = self.scope.type_of(col)
        column: exp.Expr = exp.column(col.name, quoted=True)
        if kind == "num" and not total_numeric(self.scope.types[col.name]):
            # DECIMAL, HUGEINT and unsigned 64-bit columns can overflow in the implicit
            # casts of a comparison; DOUBLE comparisons never raise.
            column = exp.TryCast(this=column, to=exp.DataType.build("DOUBLE"))
        return column, kind

    def _literal(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        assert isinstance(node, exp.Literal)
        assert node.is_string  # numbers are constants, folded before this
        return exp.Literal.string(node.this), "str"

    def _null(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        return exp.null(), "null"

    def _boolean(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        return exp.Boolean(this=bool(node.this)), "bool"

    # -- operators ------------------------------------------------------------------------
    def _paren(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        inner, kind = self.check(node.this)
        return exp.Paren(this=inner), kind

    def _neg(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        inner, kind = self.check(node.this)
        self._same(node, [kind, "num"], "-")
        return exp.Neg(this=_double(inner)), "num"

    def _arith(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        left, lk = self.check(node.this)
        right, rk = self.check(node.expression)
        self._same(node, [lk, rk, "num"], "arithmetic")
        # DOUBLE arithmetic is total in DuckDB (inf/nan instead of overflow or /0 errors).
        return type(node)(this=_double(left), expression=_double(right)), "num"

    def _compare(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        left, lk = self.check(node.this)
        right, rk = self.check(node.expression)
        self._same(node, [lk, rk], "comparison")
        return type(node)(this=left, expression=right), "bool"

    def _logic(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        left, lk = self.check(node.this)
        right, rk = self.check(node.expression)
        self._same(node, [lk, rk, "bool"], node.key.upper())
        return type(node)(this=left, expression=right), "bool"

    def _not(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        inner, kind = self.check(node.this)
        self._same(node, [kind, "bool"], "NOT")
        return exp.Not(this=inner), "bool"

    def _between(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        if node.args.get("symmetric"):
            raise reject(self.source, "BETWEEN SYMMETRIC is not allowed", node,
                         construct="BETWEEN SYMMETRIC", advice="write BETWEEN low AND high")
        this, tk = self.check(node.this)
        low, lk = self.check(node.args["low"])
        high, hk = self.check(node.args["high"])
        self._same(node, [tk, lk, hk], "BETWEEN")
        return exp.Between(this=this, low=low, high=high), "bool"

    def _in(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise reject(self.source, "IN with a subquery is not allowed", node,
                         construct="subquery", advice="list the values: IN (1, 2, 3)")
        this, kind = self.check(node.this)
        items = []
        kinds = [kind]
        for item in node.expressions:
            if not isinstance(item, (exp.Literal, exp.Null, exp.Boolean, exp.Neg)):
                raise reject(self.source, "IN takes a list of literal values", item,
                             construct="IN", advice="list the values: IN (1, 2, 3)")
            rewritten, item_kind = self.check(item)
            items.append(rewritten)
            kinds.append(item_kind)
        self._same(node, kinds, "IN")
        return exp.In(this=this, expressions=items), "bool"

    def _is(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        this, kind = self.check(node.this)
        target = node.expression
        if isinstance(target, exp.Null):
            return exp.Is(this=this, expression=exp.null()), "bool"
        if isinstance(target, exp.Boolean):
            self._same(node, [kind, "bool"], "IS")
            return exp.Is(this=this, expression=exp.Boolean(this=bool(target.this))), "bool"
        raise reject(self.source, "IS takes NULL, TRUE or FALSE", node, construct="IS",
                     advice="write IS NULL or IS NOT NULL")

    def _like(self, node: exp.Expr, escape: exp.Expr | None = None) -> tuple[exp.Expr, Type]:
        this, kind = self.check(node.this)
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise reject(self.source, f"{node.key.upper()} needs a quoted pattern", node,
                         construct=node.key.upper(), advice="write col LIKE 'abc%'")
        self._same(node, [kind, "str"], node.key.upper())
        out = type(node)(this=this, expression=exp.Literal.string(pattern.this))
        if escape is not None and _ends_with_escape(pattern.this, escape.this):
            raise reject(self.source, "a LIKE pattern must not end with its escape character",
                         node, construct="ESCAPE", advice="escape the last character or drop "
                         "the ESCAPE clause")
        if escape is not None:
            return exp.Escape(this=out, expression=escape), "bool"
        return out, "bool"

    def _escape(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        char = node.expression
        # DuckDB takes one byte and checks the pattern per row. A punctuation mark is the
        # same after ILIKE lowercases pattern and escape (no character lowercases to one),
        # so the check of a trailing escape below holds for LIKE and ILIKE alike; a letter
        # would not ('Q' ends 'abcq' once lowercased, and so does the Kelvin sign 'K').
        if not (isinstance(char, exp.Literal) and char.is_string and len(char.this) == 1
                and char.this in string.punctuation):
            raise reject(self.source, "ESCAPE takes one quoted ASCII punctuation character",
                         node, construct="ESCAPE", advice="write LIKE 'a!%%' ESCAPE '!'")
        if not isinstance(node.this, (exp.Like, exp.ILike)):
            raise self._refuse(node)
        return self._like(node.this, exp.Literal.string(char.this))

    # -- functions ------------------------------------------------------------------------
    def _abs(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        inner, kind = self.check(node.this)
        self._same(node, [kind, "num"], "abs")
        return exp.Abs(this=_double(inner)), "num"

    def _round(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        inner, kind = self.check(node.this)
        self._same(node, [kind, "num"], "round")
        digits = node.args.get("decimals")
        if digits is not None:
            if not (isinstance(digits, exp.Literal) and not digits.is_string
                    and digits.this.isdigit() and int(digits.this) <= 15):
                raise reject(self.source, "round takes a number of digits from 0 to 15", node,
                             construct="round", advice="write round(x) or round(x, 2)")
            return exp.Round(this=_double(inner), decimals=exp.Literal.number(digits.this)), "num"
        if any(node.args.get(k) for k in node.args if k not in ("this", "decimals")):
            raise self._refuse(node)
        return exp.Round(this=_double(inner)), "num"

    def _string_fn(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        inner, kind = self.check(node.this)
        self._same(node, [kind, "str"], node.key)
        return type(node)(this=inner), "str"

    def _length(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        inner, kind = self.check(node.this)
        self._same(node, [kind, "str"], "length")
        return exp.Length(this=inner), "num"

    def _coalesce(self, node: exp.Expr) -> tuple[exp.Expr, Type]:
        parts = [self.check(n) for n in [node.this, *node.expressions]]
        kind = self._same(node, [k for _, k in parts], "coalesce")
        first, *rest = (p for p, _ in parts)
        if kind == "num":
            first, rest = _double(first), [_double(r) for r in rest]
        return exp.Coalesce(this=first, expressions=rest), kind


def _double(node: exp.Expr) -> exp.Expr:
    """``CAST(node AS DOUBLE)`` unless ``node`` is a numeric literal or NULL."""
    if isinstance(node, exp.Null) or (isinstance(node, exp.Literal) and not node.is_string):
        return node
    return exp.cast(node, exp.DataType.build("DOUBLE"))


def _ends_with_escape(pattern: str, escape: str) -> bool:
    """Whether ``pattern`` ends with an escape character that escapes nothing."""
    trailing = len(pattern) - len(pattern.rstrip(escape))
    return trailing % 2 == 1
