"""The cost at which a query's intervals meet a target error (``dpsql.target_error``).

``EXPLAIN PRIVACY`` suggests, for each measurement, the least query cost (split
equally over the query's measurements, as a charge would be) whose interval
half-width at the confidence level is at most the target, in the measurement's
own units (rows for a count, the column's units for a sum). A quantile has no
interval of values (its accuracy is a rank error in rows, which depends on the
private distribution once read as values), so it gets no suggestion. Free: it
reads only the plan and public calibration, never data.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

from dpsql.errors import QueryRejected
from dpsql.privacy import Kind, PrivacyCost
from dpsql.query.model import Measure, QueryPlan
from dpsql.query.render import Context, calibrate_measure

#: Suggestions are rounded up to this many significant figures.
FIGURES = 3
_STEPS = 40  # bisection steps on log(cost): a bracket of 2**40 shrinks below 1e-4 relative


def suggest(plan: QueryPlan, accounting: Kind, ctx: Context, level: float,
            target: float) -> list[PrivacyCost | None]:
    """Per measure of ``plan``: the least query cost meeting ``target``, None if none can.

    None for a quantile measure too (no interval: see the module docstring).
    """
    ctx = replace(ctx, exact=False)
    return [None if m.kind == "quantile" else _least_cost(plan, m, accounting, ctx, level, target)
            for m in plan.measures]


def _least_cost(plan: QueryPlan, measure: Measure, accounting: Kind, ctx: Context,
                level: float, target: float) -> PrivacyCost | None:
    shares = len(plan.measures)

    def meets(value: float) -> bool:
        cost = PrivacyCost.from_fraction(accounting, Fraction(value))
        share = cost.split([1] * shares)[0]  # every share is equal
        try:
            noise = calibrate_measure(plan, measure, share, accounting, ctx)
        except QueryRejected:  # too little budget for the sampler: more noise than any target
            return False
        return noise.halfwidth(level) <= target

    low, high = math.log(1e-12), math.log(1e6)
    if not meets(math.exp(high)):
        return None
    for _ in range(_STEPS):
        middle = (low + high) / 2
        low, high = (low, middle) if meets(math.exp(middle)) else (middle, high)
    value = _round_up(math.exp(high))
    while not meets(value):  # the half-width is monotone in the cost; rounding only helps
        value = _round_up(value * 1.001)
    return PrivacyCost.from_fraction(accounting, Fraction(value))


def _round_up(value: float) -> float:
    """``value`` rounded up to :data:`FIGURES` significant figures."""
    step = 10 ** (math.floor(math.log10(value)) - FIGURES + 1)
    return math.ceil(value / step - 1e-9) * step
