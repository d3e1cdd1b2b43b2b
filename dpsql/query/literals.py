"""Numeric literals and column types: exact constant folding and the type classes of columns.

Arithmetic on literals alone is folded here, exactly (as fractions): DuckDB never
sees it, and a constant that overflows BIGINT or DOUBLE, or divides by zero, is
refused before any charge, at its position, whatever the rows.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

from sqlglot import exp

from dpsql.query.dialect import reject

Type = Literal["num", "str", "bool", "null", "other"]

_NUMERIC = re.compile(r"^(U?(TINY|SMALL|BIG|HUGE)?INT(EGER)?|DOUBLE|FLOAT|REAL|DECIMAL.*|"
                      r"NUMERIC.*|INT\d+|FLOAT\d+)$")
_INT64 = 2**63
_Exact = int | Fraction
_FOLD: dict[type[exp.Expr], Callable[[_Exact, _Exact], _Exact]] = {
    exp.Add: operator.add, exp.Sub: operator.sub, exp.Mul: operator.mul,
    exp.Div: operator.truediv}
_FOLDABLE = frozenset({exp.Literal, exp.Neg, exp.Paren, exp.Abs, *_FOLD})

def sql_type(duckdb_type: str) -> Type:
    """The predicate type class of a DuckDB column type."""
    upper = duckdb_type.upper()
    if _NUMERIC.match(upper):
        return "num"
    if upper in ("VARCHAR", "TEXT", "STRING") or upper.startswith("ENUM"):
        return "str"
    if upper == "BOOLEAN":
        return "bool"
    return "other"


@dataclass(frozen=True)
class Constant:
    """The exact value of numeric literals under + - * / abs(); ``integer``: typed BIGINT.

    Integer literals and + - * abs() of them are BIGINT, as in DuckDB; a decimal
    literal or a division makes the value DOUBLE (rounded once, when written out).
    """

    value: int | Fraction  # an int when ``integer`` (much faster than a Fraction)
    integer: bool

    @property
    def text(self) -> str:
        """The value as a SQL number: the integer, or the nearest DOUBLE."""
        return str(self.value.numerator) if self.integer else repr(float(self.value))

    def sql(self) -> exp.Expr:
        """The value as SQL: a BIGINT literal or a DOUBLE literal."""
        if self.integer:
            return exp.Literal.number(self.text)
        return exp.cast(exp.Literal.number(self.text), exp.DataType.build("DOUBLE"))


def _shown(node: exp.Expr) -> str:
    text = node.sql(dialect="duckdb")
    return text if len(text) <= 60 else text[:57] + "..."


def _representable(constant: Constant, node: exp.Expr, source: str) -> Constant:
    """``constant`` if BIGINT (integers) or DOUBLE (the rest) holds it, else QueryRejected."""
    if constant.integer:
        if -_INT64 <= constant.value < _INT64:
            return constant
        raise reject(source, f"the constant {_shown(node)} is outside the BIGINT range", node,
                     construct="constant out of range", advice="keep integer constants "
                     "within +-9223372036854775807, or write a decimal (1e19) to compute "
                     "in DOUBLE")
    try:
        float(constant.value)
    except OverflowError:
        raise reject(source, f"the constant {_shown(node)} is outside the DOUBLE range", node,
                     construct="constant out of range",
                     advice="use numbers below 1.7e308 in magnitude") from None
    return constant


def read_number(node: exp.Literal, source: str, negated: bool = False) -> Constant:
    """The exact value of a numeric literal (negated for ``-literal``), or QueryRejected."""
    text = node.this
    sign = -1 if negated else 1
    try:
        return _representable(Constant(sign * int(text), True), node, source)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        raise reject(source, f"cannot read the number {text!r}", node, construct="literal",
                     advice="write a plain decimal number") from None
    if not math.isfinite(number):
        raise reject(source, f"the number {text} is out of range", node, construct="literal",
                     advice="use a finite number")
    exponent = re.search(r"[eE]([+-]?\d+)$", text)
    try:  # the decimal's own value, unless its exponent is too long to expand exactly
        exact = Fraction(text) if not exponent or abs(int(exponent[1])) <= 400 \
            else Fraction(number)
    except ValueError:
        exact = Fraction(number)
    return Constant(sign * exact, False)


@dataclass
class Folder:
    """Evaluates constant subexpressions exactly, each node once (a memo by node)."""

    source: str
    known: dict[int, tuple[exp.Expr, Constant | None]] = field(default_factory=dict)

    def constant(self, node: exp.Expr) -> Constant | None:
        """The value of ``node`` if it is made of numeric literals only, else None."""
        if type(node) not in _FOLDABLE:  # most nodes: nothing to remember
            return None
        if isinstance(node, exp.Literal):  # a leaf: cheaper to read than to remember
            return None if node.is_string else read_number(node, self.source)
        seen = self.known.get(id(node))
        if seen is None or seen[0] is not node:  # holding the node keeps its id unique
            seen = self.known[id(node)] = (node, self._evaluate(node))
        return seen[1]

    def _evaluate(self, node: exp.Expr) -> Constant | None:
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) \
                and not node.this.is_string:
            return read_number(node.this, self.source, negated=True)
        if isinstance(node, (exp.Paren, exp.Neg, exp.Abs)):
            inner = self.constant(node.this)
            if inner is None or isinstance(node, exp.Paren):
                return inner
            # abs() by hand: mypy infers abs() of int | Fraction as object
            negate = isinstance(node, exp.Neg) or inner.value < 0
            value = -inner.value if negate else inner.value
            return _representable(Constant(value, inner.integer), node, self.source)
        op = _FOLD.get(type(node))
        if op is None:
            return None
        left = self.constant(node.this)
        right = self.constant(node.expression) if left is not None else None
        if left is None or right is None:
            return None
        if isinstance(node, exp.Div):
            if right.value == 0:
                raise reject(self.source, f"{_shown(node)} divides by zero", node,
                             construct="division by zero", advice="divide by a non-zero "
                             "number")
            return _representable(Constant(Fraction(left.value) / right.value, False), node,
                                  self.source)
        return _representable(Constant(op(left.value, right.value),
                                       left.integer and right.integer), node, self.source)


_TOTAL_NUMERIC = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT",
                  "UINTEGER", "INT", "INT1", "INT2", "INT4", "INT8", "DOUBLE", "FLOAT", "REAL",
                  "FLOAT4", "FLOAT8")


def total_numeric(sql_type: str) -> bool:
    """Whether comparisons of this column type with integers and doubles never raise."""
    return sql_type.upper() in _TOTAL_NUMERIC
