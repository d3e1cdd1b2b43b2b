"""Helpers for pinning privacy maps at their boundary."""

from __future__ import annotations

from dpsql.privacy import PrivacyCost


def less(cost: PrivacyCost) -> PrivacyCost:
    """The next representable cost below ``cost`` (one quantum less)."""
    return PrivacyCost(cost.kind, cost.units - 1)
