"""The discrete Gaussian mechanism pinned at its boundary (moved from tests/test_privacy.py)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dpsql.errors import ConfigurationError
from dpsql.mechanisms.gaussian import GaussianMechanism
from dpsql.privacy import PrivacyCost


def test_gaussian_boundary():
    rho = PrivacyCost.zcdp("0.02")
    mech = GaussianMechanism.calibrate(3, rho)
    assert mech.sigma2 == Fraction(9) / (2 * Fraction("0.02"))
    assert mech.check(3, rho)
    assert not mech.check(3, PrivacyCost("zcdp", rho.units - 1))
    assert mech.cost() == rho


def test_gaussian_needs_zcdp():
    with pytest.raises(ConfigurationError):
        GaussianMechanism.calibrate(1, PrivacyCost.pure(1))
