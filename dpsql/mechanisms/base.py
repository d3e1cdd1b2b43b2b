"""The one protocol every mechanism of :mod:`dpsql.mechanisms` implements.

A mechanism is a frozen object holding its exact parameters. It knows

- ``sensitivity``: how far apart, in its input metric (L1 or L2 distance of an
  integer vector, score units, rows), the inputs of two neighbouring datasets
  can be: one privacy unit added or removed (DESIGN.md, "Privacy model");
- ``calibrate(sensitivity, share)`` (a classmethod): the least noise whose loss
  fits in ``share``, in the share's accounting; it checks its result with the
  privacy map before returning it (:func:`verified`), so a wrong formula raises
  :class:`~dpsql.errors.InternalError` instead of releasing anything;
- ``cost(kind)``: the exact loss of one run on neighbours one privacy unit
  apart, as a :class:`~dpsql.privacy.PrivacyCost` in ``kind`` accounting
  (``pure`` or ``zcdp``), computed exactly and rounded up once, against the
  analyst; a mechanism that cannot be charged in ``kind`` raises
  :class:`~dpsql.errors.ConfigurationError` (Gaussian noise is not pure DP);
- ``check(d_in, d_out)``: its privacy map (OpenDP's): if the inputs differ by at
  most ``d_in``, is the loss at most ``d_out``? Exact on both sides, so
  ``check(sensitivity, cost(kind))`` holds and one quantum less does not
  (``tests/mechanisms`` pins that boundary for every mechanism).

The proof sits beside each class in its ``Privacy:`` paragraph: the unit, the
sensitivity, the cost and the citation. Mechanisms sample only through
:mod:`dpsql.noise` and :mod:`dpsql._exact` (exact samplers fed by the OS
CSPRNG), never ``numpy.random``; units and conversions stay in
:mod:`dpsql.privacy`. This package imports nothing else of dpsql but
:mod:`dpsql.errors`; ``query/`` and ``synth/`` import it, never the reverse.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Protocol, TypeVar, runtime_checkable

from dpsql.errors import ConfigurationError, InternalError
from dpsql.privacy import Kind, Number, PrivacyCost, to_fraction


@runtime_checkable
class Mechanism(Protocol):
    """What every mechanism offers (see the module docstring); ``calibrate`` is a classmethod."""

    @property
    def name(self) -> str:
        """The mechanism's name as provenance and ``EXPLAIN PRIVACY`` show it."""
        ...

    @property
    def sensitivity(self) -> Fraction | float:
        """The distance, in the input metric, between the inputs of neighbouring datasets."""
        ...

    def cost(self, kind: Kind) -> PrivacyCost:
        """The exact loss of one run at ``sensitivity``, in ``kind`` accounting, rounded up."""
        ...

    def check(self, d_in: Number, d_out: PrivacyCost) -> bool:
        """Whether inputs at most ``d_in`` apart lose at most ``d_out``."""
        ...


M = TypeVar("M")


def verified(mechanism: M, holds: bool) -> M:
    """``mechanism``, once its privacy map said its share holds; else a bug, never a release."""
    if not holds:
        raise InternalError(f"a calibrated {type(mechanism).__name__} does not meet its share; "
                            "this is a bug in dpsql")
    return mechanism


def positive(value: Number, what: str) -> Fraction:
    """``value`` read exactly; ConfigurationError unless it is > 0."""
    exact = to_fraction(value, what)
    if exact <= 0:
        raise ConfigurationError(f"{what} must be > 0, got {value}")
    return exact


def loss_fits(epsilon: Fraction, d_out: PrivacyCost) -> bool:
    """Whether a pure ``epsilon``-DP loss is within ``d_out`` (as epsilon^2 / 2 under zCDP)."""
    if d_out.infinite:
        return True
    if d_out.kind == "pure":
        return epsilon <= d_out.value
    return epsilon**2 / 2 <= d_out.value
