"""Units of privacy loss, composition and conversions.

Costs are exact: a :class:`PrivacyCost` holds an integer number of quanta of
``1e-18`` epsilon (pure DP) or rho (zCDP). Anything computed in floating point
is rounded against the analyst: a charge rounds up, a budget or the remaining
allowance rounds down. User-typed decimals are read as the decimal they show
(``0.1`` is one tenth), so ten charges of 0.1 spend a budget of 1.0 exactly.

The mechanisms that spend these costs (calibration, cost and privacy map, each
beside its proof) live in :mod:`dpsql.mechanisms`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from typing import Literal

from dpsql.errors import ConfigurationError

Kind = Literal["pure", "zcdp"]
#: How a displayed figure rounds: charges and spent ``up``, remaining ``down``, granted ``nearest``.
Rounding = Literal["up", "down", "nearest"]
Number = int | float | str | Fraction | Decimal

QUANTUM = Fraction(1, 10**18)
_PER_UNIT = 10**18
#: The largest single cost the ledger records (its units column is a 128-bit integer).
MAX_UNITS = 10**36
#: How a zCDP cost's epsilon at a delta is worked out (named in JSON forms and provenance).
CONVERSION = "tight zCDP to (epsilon, delta): Canonne, Kamath & Steinke 2020, Prop. 12"
#: Significant figures of every displayed epsilon or rho.
FIGURES = 4
#: Why a zCDP budget is counted in rho: one line for every display that shows one.
WHY_RHO = ("under zCDP rho adds up (granted = spent + remaining); epsilon at a fixed delta is a "
           "concave function of rho, so epsilons do not add")


def to_fraction(value: Number, what: str = "value") -> Fraction:
    """Read a user-typed number exactly; floats as the shortest decimal that prints them."""
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be a number, not a boolean")
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ConfigurationError(f"{what} must be finite, got {value}")
        return Fraction(repr(value))
    try:
        result = Fraction(value)
    except (ValueError, TypeError, ZeroDivisionError) as err:
        raise ConfigurationError(f"{what} must be a number, got {value!r}") from err
    return result


def _is_infinite(value: Number) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"inf", "+inf", "infinity", ".inf"}
    return isinstance(value, float) and math.isinf(value) and value > 0


def check_delta(delta: Number) -> Fraction:
    """Validate a delta: a number in [0, 1)."""
    if isinstance(delta, float) and math.isnan(delta):
        raise ConfigurationError("delta must be a number in [0, 1), got nan")
    value = to_fraction(delta, "delta")
    if not 0 <= value < 1:
        raise ConfigurationError(f"delta must be in [0, 1), got {delta}; a typical value is 1e-6")
    return value


@dataclass(frozen=True, order=False)
class PrivacyCost:
    """An exact amount of privacy loss: epsilon (``pure``) or rho (``zcdp``).

    ``units`` counts quanta of 1e-18; ``infinite`` marks the unbounded budget
    that exactness tests and explicit policies may use.
    """

    kind: Kind
    units: int
    infinite: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("pure", "zcdp"):
            raise ConfigurationError(f"privacy kind must be 'pure' or 'zcdp', got {self.kind!r}")
        if self.units < 0:
            raise ConfigurationError("a privacy cost cannot be negative")

    # -- construction ---------------------------------------------------------
    @classmethod
    def pure(cls, epsilon: Number) -> PrivacyCost:
        """A pure-DP cost of ``epsilon`` (rounded up to the quantum)."""
        return cls._make("pure", epsilon, "epsilon")

    @classmethod
    def zcdp(cls, rho: Number) -> PrivacyCost:
        """A zCDP cost of ``rho`` (rounded up to the quantum)."""
        return cls._make("zcdp", rho, "rho")

    @classmethod
    def zero(cls, kind: Kind) -> PrivacyCost:
        """No privacy loss (a cached answer, a post-processing step)."""
        return cls(kind, 0)

    @classmethod
    def unbounded(cls, kind: Kind) -> PrivacyCost:
        """The infinite budget: mechanisms calibrated to it add no noise."""
        return cls(kind, 0, infinite=True)

    @classmethod
    def from_fraction(cls, kind: Kind, value: Fraction, *, round_up: bool = True) -> PrivacyCost:
        """Quantize an exact value; charges round up, budgets round down."""
        scaled = value * _PER_UNIT
        units = math.ceil(scaled) if round_up else math.floor(scaled)
        return cls(kind, units)

    @classmethod
    def _make(cls, kind: Kind, value: Number, what: str) -> PrivacyCost:
        if _is_infinite(value):
            return cls.unbounded(kind)
        if isinstance(value, float) and math.isnan(value):
            raise ConfigurationError(f"{what} must be a positive number, got nan")
        exact = to_fraction(value, what)
        if exact < 0:
            raise ConfigurationError(f"{what} must be positive, got {value}")
        return cls.from_fraction(kind, exact)

    # -- values ---------------------------------------------------------------
    @property
    def value(self) -> Fraction:
        """Epsilon (pure) or rho (zcdp) as an exact fraction; infinite costs raise."""
        if self.infinite:
            raise ConfigurationError("an infinite budget has no finite value")
        return Fraction(self.units, _PER_UNIT)

    def __float__(self) -> float:
        return math.inf if self.infinite else float(self.value)

    @property
    def is_zero(self) -> bool:
        """No loss at all (and not the infinite budget)."""
        return not self.infinite and self.units == 0

    # -- composition ----------------------------------------------------------
    def _same_kind(self, other: PrivacyCost) -> None:
        if not isinstance(other, PrivacyCost):
            raise TypeError(f"cannot combine a PrivacyCost with {type(other).__name__}")
        if other.kind != self.kind:
            raise ConfigurationError(
                f"cannot combine a {self.kind} cost with a {other.kind} cost; "
                "convert with to_zcdp() first"
            )

    def __add__(self, other: PrivacyCost) -> PrivacyCost:
        """Sequential composition: epsilons (pure) or rhos (zCDP) add up."""
        self._same_kind(other)
        if self.infinite or other.infinite:
            return PrivacyCost.unbounded(self.kind)
        return PrivacyCost(self.kind, self.units + other.units)

    def __sub__(self, other: PrivacyCost) -> PrivacyCost:
        """What is left of a budget after ``other`` (never below zero)."""
        self._same_kind(other)
        if self.infinite:
            return self
        if other.infinite:
            return PrivacyCost.zero(self.kind)
        return PrivacyCost(self.kind, max(0, self.units - other.units))

    def _key(self, other: PrivacyCost) -> tuple[tuple[bool, int], tuple[bool, int]]:
        self._same_kind(other)
        return (self.infinite, self.units), (other.infinite, other.units)

    def __le__(self, other: PrivacyCost) -> bool:
        a, b = self._key(other)
        return a <= b

    def __lt__(self, other: PrivacyCost) -> bool:
        a, b = self._key(other)
        return a < b

    def __ge__(self, other: PrivacyCost) -> bool:
        a, b = self._key(other)
        return a >= b

    def __gt__(self, other: PrivacyCost) -> bool:
        a, b = self._key(other)
        return a > b

    def times(self, factor: Number) -> PrivacyCost:
        """``factor`` compositions of this cost (rounded up)."""
        exact = to_fraction(factor, "factor")
        if self.infinite:
            return self
        return PrivacyCost.from_fraction(self.kind, self.value * exact)

    def split(self, shares: list[Number] | tuple[Number, ...]) -> list[PrivacyCost]:
        """Divide into parts proportional to ``shares``; parts round down so they sum <= self."""
        exact = [to_fraction(s, "share") for s in shares]
        if not exact or any(s <= 0 for s in exact):
            raise ConfigurationError("budget shares must be positive numbers")
        total = sum(exact)
        if self.infinite:
            return [self for _ in exact]
        return [
            PrivacyCost.from_fraction(self.kind, self.value * s / total, round_up=False)
            for s in exact
        ]

    # -- conversions ----------------------------------------------------------
    def to_zcdp(self) -> PrivacyCost:
        """Pure epsilon-DP implies (epsilon^2/2)-zCDP (Bun & Steinke 2016, Prop. 1.4)."""
        if self.kind == "zcdp":
            return self
        if self.infinite:
            return PrivacyCost.unbounded("zcdp")
        return PrivacyCost.from_fraction("zcdp", self.value**2 / 2)

    def to(self, kind: Kind) -> PrivacyCost:
        """This cost in the accounting ``kind`` of a policy (zCDP cannot become pure)."""
        if kind == self.kind:
            return self
        if kind == "zcdp":
            return self.to_zcdp()
        raise ConfigurationError(
            "a zCDP cost cannot be charged to a pure-DP budget; "
            "use a policy with accounting: zcdp for Gaussian mechanisms"
        )

    def epsilon(self, delta: Number = 0) -> float:
        """Epsilon for display: the value itself (pure) or the zCDP bound at ``delta``."""
        if self.infinite:
            return math.inf
        if self.kind == "pure":
            return float(self.value)
        return epsilon_from_rho(self.value, delta)

    def describe(self, delta: Number | None = None, rounding: Rounding = "up") -> str:
        """Human form with both units, e.g. ``rho=0.005 (epsilon=0.42 at delta=1e-06)``.

        Four significant figures, rounded as ``rounding`` says: a cost or what is
        spent up, what remains down, what was granted to the nearest.
        """
        if self.infinite:
            return "epsilon=inf" if self.kind == "pure" else "rho=inf"
        if self.kind == "pure":
            return f"epsilon={figure(self.value, rounding)}"
        text = f"rho={figure(self.value, rounding)}"
        if delta:
            eps = figure(self.epsilon(delta), rounding)
            text += f" (epsilon={eps} at delta={float(delta):g})"
        return text

    def as_dict(self, delta: Number | None = None) -> dict[str, object]:
        """JSON-able form with both units where they apply."""
        out: dict[str, object] = {"kind": self.kind}
        if self.infinite:
            out["value"] = "inf"
            return out
        name = "epsilon" if self.kind == "pure" else "rho"
        out[name] = _plain(_decimal(self.value))
        if self.kind == "zcdp" and delta:
            out["epsilon"] = self.epsilon(delta)
            out["delta"] = float(delta)
            out["conversion"] = CONVERSION
        return out

    def __str__(self) -> str:
        return self.describe()


def figure(value: Fraction | float, rounding: Rounding = "up", digits: int = FIGURES) -> str:
    """``value`` to ``digits`` significant figures, rounded as ``rounding`` says.

    A float (an epsilon from the zCDP conversion, good to about 1e-12) is first
    read at 10 figures, so that the budget "epsilon 1", stored as the largest rho
    within it, shows as 1 and not 0.9999.
    """
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        exact = _rounded(Decimal(value), 10, ROUND_HALF_EVEN)
    else:
        exact = _decimal(value)
    modes = {"up": ROUND_CEILING, "down": ROUND_FLOOR, "nearest": ROUND_HALF_EVEN}
    return _plain(_rounded(exact, digits, modes[rounding]))


def _decimal(value: Fraction) -> Decimal:
    return Decimal(value.numerator) / Decimal(value.denominator)


def _rounded(value: Decimal, digits: int, mode: str) -> Decimal:
    if value == 0:
        return value
    return value.quantize(Decimal(1).scaleb(value.adjusted() - digits + 1), rounding=mode)


def _plain(value: Decimal) -> str:
    """A decimal without exponent or trailing zeros."""
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


# -- (epsilon, delta) <-> zCDP ------------------------------------------------
#
# rho-zCDP implies (epsilon, delta)-DP at every order alpha = 1 + x > 1 with
#   epsilon = rho (1 + x) + log(x / (1 + x)) + (log(1/delta) - log(1 + x)) / x
# (Canonne, Kamath & Steinke 2020, Prop. 12 and Cor. 13), the bound
# dp-accounting's RDP accountant uses. (It also uses (0, delta)-DP when delta >=
# sqrt(1 - exp(-rho)), as its orders stop at 1.01; searched over every x > 0,
# the bound above came out <= 0 there in every case tested.) Every x gives a valid bound, so an
# inexact search loses tightness, never privacy. The bound's derivative in x is
# rho - (log(1/delta) - log(1 + x)) / x^2: the best x is the one root of
# rho x^2 + log(1 + x) = log(1/delta).

_MARGIN = 1e-12  # relative slack covering float error in one bound's terms


def _bound_terms(x: float, rho: float, log_inv_delta: float) -> tuple[float, float, float]:
    """The three terms of the epsilon bound at alpha = 1 + x (their sum is epsilon)."""
    return rho * (1 + x), math.log(x) - math.log1p(x), (log_inv_delta - math.log1p(x)) / x


def _root(f: Callable[[float], float], slope: Callable[[float], float], u: float,
          lo: float, hi: float) -> float:
    """The x where ``f``, increasing in u = log x, crosses 0 in [lo, hi].

    Newton's method from ``u`` in steps of at most 1, bisecting whenever a step
    would leave the bracket.
    """
    for _ in range(200):
        value = f(u)
        if value < 0:
            lo = u
        elif value > 0:
            hi = u
        else:
            break
        step = max(-1.0, min(1.0, value / slope(u)))
        if abs(step) <= 1e-12 * max(1.0, abs(u)):
            break
        u = u - step if lo < u - step < hi else (lo + hi) / 2
    return math.exp(u)


def zcdp_epsilon(rho: float, delta: float) -> tuple[float, float]:
    """The tight epsilon of rho-zCDP at ``delta`` and the order alpha that gives it.

    Rounded up past the float error of the bound at that alpha.
    """
    log_inv_delta = -math.log(delta)

    def excess(u: float) -> float:
        return rho * math.exp(2 * u) + math.log1p(math.exp(u)) - log_inv_delta

    def slope(u: float) -> float:
        x = math.exp(u)
        return x * (2 * rho * x + 1 / (1 + x))

    top = 0.5 * math.log(log_inv_delta / rho)  # the loose bound's best x: above the root
    x = _root(excess, slope, top, top - 100, top)
    terms = _bound_terms(x, rho, log_inv_delta)
    slack = _MARGIN * sum(abs(term) for term in terms)
    return max(0.0, math.nextafter(sum(terms) + slack, math.inf)), 1 + x


def epsilon_from_rho(rho: Number, delta: Number) -> float:
    """The smallest epsilon for which rho-zCDP implies (epsilon, delta)-DP (tight, see above).

    Rounded up (a display that never understates the loss).
    """
    r = float(to_fraction(rho, "rho"))
    d = float(check_delta(delta))
    if r == 0:
        return 0.0
    if d == 0:
        return math.inf
    return zcdp_epsilon(r, d)[0]


def _largest_rho(epsilon: float, delta: float) -> float:
    """The largest rho that is (epsilon, delta)-DP by the bounds above, rounded down.

    At its best x, rho = A / x^2 with A = log(1/delta) - log(1 + x), and its
    epsilon, E(x) = A (1 + 2x) / x^2 + log(x / (1 + x)), falls as x grows
    (E' = -1/x^2 - 2A(1 + x)/x^3); the x where E = ``epsilon`` is found, and the
    bound at that x solved for rho.
    """
    log_inv_delta = -math.log(delta)

    def shortfall(u: float) -> float:  # epsilon - E(x), increasing in u = log x
        x = math.exp(u)
        a = log_inv_delta - math.log1p(x)
        return epsilon - a * (1 + 2 * x) / (x * x) - math.log(x) + math.log1p(x)

    def slope(u: float) -> float:
        x = math.exp(u)
        return 1 / x + 2 * (log_inv_delta - math.log1p(x)) * (1 + x) / (x * x)

    # The loose bound's rho is smaller, so at its best x E < epsilon already.
    loose = (math.sqrt(log_inv_delta + epsilon) - math.sqrt(log_inv_delta)) ** 2
    top = min(0.5 * math.log(log_inv_delta / loose), math.log(math.expm1(log_inv_delta)))
    x = _root(shortfall, slope, top, top - 100, top)
    _, log_term, delta_term = _bound_terms(x, 0.0, log_inv_delta)
    slack = _MARGIN * (epsilon + abs(log_term) + abs(delta_term))
    return max(0.0, (epsilon - log_term - delta_term - slack) / (1 + x))


def rho_from_epsilon_delta(epsilon: Number, delta: Number) -> PrivacyCost:
    """The largest rho whose zCDP guarantee implies (epsilon, delta)-DP, rounded down.

    Inverts ``epsilon_from_rho`` (the tight conversion) with one search over alpha.
    """
    if _is_infinite(epsilon):
        return PrivacyCost.unbounded("zcdp")
    eps = float(check_epsilon(epsilon))
    d = float(check_delta(delta))
    if d == 0:
        raise ConfigurationError(
            "a zCDP budget needs delta > 0 to be written as (epsilon, delta); give rho instead"
        )
    cost = PrivacyCost.from_fraction("zcdp", Fraction(_largest_rho(eps, d)), round_up=False)
    # The two searches may settle a hair apart: step down until the bound holds.
    while cost.units > 0 and epsilon_from_rho(cost.value, d) > eps:
        cost = PrivacyCost("zcdp", cost.units - max(1, cost.units // 10**12))
    return cost


def check_epsilon(epsilon: Number) -> Fraction:
    """Validate an epsilon: finite and > 0."""
    if isinstance(epsilon, float) and (math.isnan(epsilon) or math.isinf(epsilon)):
        raise ConfigurationError(f"epsilon must be a finite positive number, got {epsilon}")
    value = to_fraction(epsilon, "epsilon")
    if value <= 0:
        raise ConfigurationError(f"epsilon must be > 0, got {epsilon}; try 0.1 to 1")
    return value


def budget_cost(
    kind: Kind,
    *,
    epsilon: Number | None = None,
    delta: Number | None = None,
    rho: Number | None = None,
    allow_infinite: bool = False,
) -> PrivacyCost:
    """A cost in a policy's accounting from what a user typed (epsilon[/delta] or rho).

    Under ``pure`` only epsilon is accepted. Under ``zcdp`` rho is native and
    (epsilon, delta) converts to the largest rho that meets it. Infinity is an
    error unless ``allow_infinite`` (policies may declare unbounded budgets).
    """
    if (epsilon is None) == (rho is None):
        raise ConfigurationError("give exactly one of epsilon or rho")
    amount = epsilon if epsilon is not None else rho
    assert amount is not None
    if _is_infinite(amount):
        if not allow_infinite:
            raise ConfigurationError("an infinite epsilon or rho is not a privacy guarantee; "
                                     "give a finite positive number")
        return PrivacyCost.unbounded(kind)
    if kind == "pure":
        if rho is not None:
            raise ConfigurationError("a pure-DP policy counts epsilon; rho needs accounting: zcdp")
        if delta not in (None, 0):
            raise ConfigurationError("a pure-DP policy has no delta; remove delta or use zcdp")
        cost = PrivacyCost.pure(check_epsilon(amount))
    elif rho is not None:
        if (isinstance(rho, float) and math.isnan(rho)) or to_fraction(rho, "rho") <= 0:
            raise ConfigurationError(f"rho must be > 0, got {rho}")
        cost = PrivacyCost.zcdp(rho)
    elif delta is None:
        raise ConfigurationError("under zCDP accounting an epsilon needs a delta (e.g. 1e-6)")
    else:
        cost = rho_from_epsilon_delta(amount, delta)
    if cost.units > MAX_UNITS:
        name = "epsilon" if epsilon is not None else "rho"
        raise ConfigurationError(f"{name} {amount} is too large to record; the ledger holds "
                                 f"amounts up to {MAX_UNITS // _PER_UNIT:.0e}")
    return cost
