"""SQL expressions over the noisy cells, evaluated in Arrow (SQL's NULL semantics), never failing.

The validated expressions of SELECT, HAVING and ORDER BY run here over the
table of noisy cells, never in a database. Every operation is total over
values: numbers of different types meet as DOUBLE (Arrow's own casts fail on
values they cannot hold exactly), arithmetic is in DOUBLE (infinity, not an
overflow; NULL for a division by zero), ``round`` leaves what a DOUBLE cannot
round as it is. A failure could only come from a type, which is public and
fixed before the charge (:func:`dpsql.query.post.check_post`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from dpsql.errors import InternalError

Value: TypeAlias = Any  # a pyarrow Array, ChunkedArray or Scalar


_BINARY: dict[type, Callable[[Value, Value], Value]] = {
    exp.Add: pc.add, exp.Sub: pc.subtract, exp.Mul: pc.multiply,
    exp.EQ: pc.equal, exp.NEQ: pc.not_equal, exp.GT: pc.greater, exp.GTE: pc.greater_equal,
    exp.LT: pc.less, exp.LTE: pc.less_equal, exp.And: pc.and_kleene, exp.Or: pc.or_kleene,
}


def evaluate(node: exp.Expr, table: pa.Table) -> Value:
    """Evaluate a validated post-processing expression over ``table`` (SQL null semantics)."""
    op = _BINARY.get(type(node))
    if op is not None:
        left, right = evaluate(node.this, table), evaluate(node.expression, table)
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
            left, right = _float(left), _float(right)
        elif isinstance(node, (exp.And, exp.Or)):
            left, right = as_type(left, pa.bool_()), as_type(right, pa.bool_())
        else:
            left, right = as_type(left, _type(right)), as_type(right, _type(left))
            if pa.types.is_null(_type(left)):  # NULL = NULL, NULL < NULL, ...
                return pa.scalar(None, pa.bool_())
            left, right = _unified(left, right)
        return op(left, right)
    if isinstance(node, exp.Column):
        return table.column(node.name)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return pa.scalar(node.this)
        text = node.this
        if not text.lstrip("-").isdigit():
            return pa.scalar(float(text))
        number = int(text)  # 2**63 under a minus sign is BIGINT's minimum
        return pa.scalar(number) if -2**63 <= number < 2**63 else pa.scalar(float(number))
    if isinstance(node, exp.Null):
        return pa.scalar(None, type=pa.null())
    if isinstance(node, exp.Boolean):
        return pa.scalar(bool(node.this))
    if isinstance(node, exp.Paren):
        return evaluate(node.this, table)
    if isinstance(node, exp.Cast):
        return _float(evaluate(node.this, table))
    if isinstance(node, exp.Neg):
        return pc.negate(_float(evaluate(node.this, table)))
    if isinstance(node, exp.Div):
        left = _float(evaluate(node.this, table))
        right = _float(evaluate(node.expression, table))
        zero = pc.equal(right, 0.0)
        return pc.if_else(zero, pa.scalar(None, pa.float64()),
                          pc.divide(left, pc.if_else(zero, 1.0, right)))
    if isinstance(node, exp.Not):
        return pc.invert(as_type(evaluate(node.this, table), pa.bool_()))
    return _evaluate_more(node, table)


def _evaluate_more(node: exp.Expr, table: pa.Table) -> Value:
    if isinstance(node, (exp.NullSafeEQ, exp.NullSafeNEQ)):
        left, right = evaluate(node.this, table), evaluate(node.expression, table)
        left, right = as_type(left, _type(right)), as_type(right, _type(left))
        if pa.types.is_null(_type(left)):
            return pa.scalar(isinstance(node, exp.NullSafeEQ))
        left, right = _unified(left, right)
        both_null = pc.and_(pc.is_null(left), pc.is_null(right))
        same = pc.if_else(both_null, True, pc.fill_null(pc.equal(left, right), False))
        return same if isinstance(node, exp.NullSafeEQ) else pc.invert(same)
    if isinstance(node, exp.Between):
        low = exp.GTE(this=node.this, expression=node.args["low"])
        high = exp.LTE(this=node.this, expression=node.args["high"])
        return evaluate(exp.And(this=low, expression=high), table)
    if isinstance(node, exp.In):
        value = evaluate(node.this, table)
        if pa.types.is_null(_type(value)):
            return pa.scalar(None, pa.bool_())
        items = [evaluate(e, table).as_py() for e in node.expressions]
        if (_is_number(_type(value)) and not pa.types.is_int64(_type(value))) or any(
                isinstance(i, float) for i in items):
            value = _float(value)  # COUNT(*) IN (1.5): compare as DOUBLE, as SQL does
        if pa.types.is_floating(_type(value)):  # Arrow refuses to round large integers
            items = [float(i) if isinstance(i, int) else i for i in items]
        found = pc.is_in(value, value_set=pa.array(items, _type(value)))
        return pc.if_else(pc.is_null(value), pa.scalar(None, pa.bool_()), found)
    if isinstance(node, exp.Is):
        value = evaluate(node.this, table)
        if isinstance(node.expression, exp.Null):
            return pc.is_null(value)
        return pc.fill_null(pc.equal(value, bool(node.expression.this)), False)
    if isinstance(node, (exp.Like, exp.ILike, exp.Escape)):
        return _like(node, table)
    if isinstance(node, exp.Abs):
        return pc.abs(_float(evaluate(node.this, table)))
    if isinstance(node, exp.Round):
        digits = int(node.args["decimals"].this) if node.args.get("decimals") else 0
        return _round(_float(evaluate(node.this, table)), digits)
    if isinstance(node, exp.Lower):
        return pc.utf8_lower(as_type(evaluate(node.this, table), pa.string()))
    if isinstance(node, exp.Upper):
        return pc.utf8_upper(as_type(evaluate(node.this, table), pa.string()))
    if isinstance(node, exp.Length):
        return pc.utf8_length(as_type(evaluate(node.this, table), pa.string()))
    if isinstance(node, exp.Coalesce):
        parts = [evaluate(n, table) for n in [node.this, *node.expressions]]
        typed = [p for p in parts if not pa.types.is_null(_type(p))]
        if not typed:
            return parts[0]
        return pc.coalesce(*_unified(*[as_type(p, _type(typed[0])) for p in parts]))
    raise InternalError(f"post-processing cannot evaluate {node.key}; this is a bug in dpsql")


def _round(value: Value, digits: int) -> Value:
    """SQL's round (half away from zero) to ``digits`` >= 0 places, for every DOUBLE.

    Arrow's round fails when ``value * 10**digits`` overflows (a value that the
    noise decides); a DOUBLE of magnitude 2**52 or more, infinity or NaN is
    already whole, so it is returned as it is.
    """
    small = pc.less(pc.abs(value), 2.0**52)
    rounded = pc.round(pc.if_else(small, value, 0.0), ndigits=digits,
                       round_mode="half_towards_infinity")
    return pc.if_else(small, rounded, value)


def _like(node: exp.Expr, table: pa.Table) -> Value:
    escape = None
    if isinstance(node, exp.Escape):
        escape = node.expression.this
        node = node.this
    value = as_type(evaluate(node.this, table), pa.string())
    return pc.match_like(value, arrow_pattern(node.expression.this, escape),
                         ignore_case=isinstance(node, exp.ILike))


def arrow_pattern(pattern: str, escape: str | None) -> str:
    """A SQL LIKE pattern (optional ESCAPE character) in Arrow's form (backslash escapes)."""
    out = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if escape is not None and char == escape and i + 1 < len(pattern):
            out.append("\\" + pattern[i + 1])
            i += 2
            continue
        out.append("\\\\" if char == "\\" else char)
        i += 1
    return "".join(out)


def _type(value: Value) -> pa.DataType:
    return value.type


def as_type(value: Value, kind: pa.DataType) -> Value:
    """A NULL literal (Arrow's null type) as a null of ``kind``; anything else unchanged."""
    if pa.types.is_null(_type(value)) and not pa.types.is_null(kind):
        return pc.cast(value, kind)
    return value


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


def _unified(*values: Value) -> list[Value]:
    """Numbers of different types as DOUBLE (as SQL compares an integer with a DOUBLE).

    Arrow's own implicit casts fail on values they cannot hold exactly (an int64
    above 2**53 as a double, a uint64 above 2**63 as an int64): a failure that
    would depend on the values, after the charge. DOUBLE holds every number
    (rounded, as SQL rounds it), so this never fails.
    """
    kinds = {_type(v) for v in values}
    if len(kinds) > 1 and all(_is_number(k) for k in kinds):
        return [_float(v) for v in values]
    return list(values)


def _float(value: Value) -> Value:
    kind = value.type
    if pa.types.is_null(kind):
        return pa.scalar(None, pa.float64()) if isinstance(value, pa.Scalar) else \
            pa.nulls(len(value), pa.float64())
    if _is_number(kind):
        return pc.cast(value, pa.float64(), safe=False)  # rounds large integers, as DOUBLE does
    return value
