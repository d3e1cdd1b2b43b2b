"""The policy's additive noise (SQL counts and sums, synthesizers' marginals): one calibration.

A wrong calibration never reaches a release: if the sampler's rounding, or the
formula, gave a scale 0.7x the right one, the privacy map would not hold at the
share, and calibration raises InternalError instead. And the noise released
has the calibrated scale: the variance of 40,000 draws is compared with the
mechanism's at 6 standard errors (false-positive rate about 2e-9), and the
scales 0.7x and 1.3x must be rejected (``tests/query/test_noise_scale.py``).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpsql import noise
from dpsql.errors import InternalError
from dpsql.mechanisms.additive import NONE, Noise, additive
from dpsql.mechanisms.gaussian import GaussianMechanism
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.privacy import PrivacyCost
from dpsql.synth.measure import measure_counts
from tests.mechanisms.boundary import less
from tests.query.test_noise_scale import check_scale

SHARES = [PrivacyCost.pure("0.3"), PrivacyCost.zcdp("0.02")]


@pytest.mark.parametrize("share", SHARES, ids=["pure", "zcdp"])
def test_the_accounting_picks_the_mechanism_and_the_map_holds_at_the_share(
        share: PrivacyCost) -> None:
    mechanism = additive(share.kind, 3, share)
    assert isinstance(mechanism, LaplaceMechanism if share.kind == "pure" else GaussianMechanism)
    assert mechanism.check(3, share)
    assert not mechanism.check(3, less(share))
    assert mechanism.cost(share.kind) == share


@pytest.mark.parametrize("share", SHARES, ids=["pure", "zcdp"])
def test_a_query_measure_is_checked_in_privacy_units(share: PrivacyCost) -> None:
    """A sum on a grid: sensitivity 3 grid units per privacy unit, two units cost more."""
    measure = Noise.calibrate(share.kind, 3, -4, share)
    assert measure.check(1, share)
    assert not measure.check(1, less(share))
    assert not measure.check(2, share)
    assert measure.cost == share
    assert measure.base is not None
    assert measure.base.param == measure.param


def test_without_noise_nothing_is_promised() -> None:
    measure = Noise.calibrate("zcdp", 1, 0, PrivacyCost.unbounded("zcdp"))
    assert measure.mechanism == NONE
    assert measure.base is None
    assert measure.check(1, PrivacyCost.unbounded("zcdp"))
    assert not measure.check(1, PrivacyCost.zcdp(10**6))


@pytest.mark.parametrize("share", SHARES, ids=["pure", "zcdp"])
def test_a_marginal_and_a_query_count_get_the_same_noise(share: PrivacyCost) -> None:
    measure = Noise.calibrate(share.kind, 2, 0, share)
    marginal = measure_counts(("a",), np.zeros(5, dtype=np.int64), share, 2)
    assert marginal.mechanism == measure.mechanism
    assert marginal.scale == measure.unit_scale
    assert measure.base is not None
    assert marginal.cost == measure.base.cost(share.kind)


@pytest.mark.parametrize(("share", "sampler", "factor"), [
    (PrivacyCost.pure("0.3"), "used_laplace_scale", Fraction(7, 10)),
    (PrivacyCost.zcdp("0.02"), "used_gaussian_sigma2", Fraction(49, 100)),
], ids=["laplace", "gaussian"])
def test_a_scale_0_7_of_the_calibration_is_caught(share: PrivacyCost, sampler: str,
                                                  factor: Fraction,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A sampler that rounded the scale down to 0.7x: calibration refuses, nothing is drawn."""
    right = getattr(noise, sampler)
    monkeypatch.setattr(noise, sampler, lambda x: right(x) * factor)
    with pytest.raises(InternalError, match="does not meet its share"):
        additive(share.kind, 1, share)
    with pytest.raises(InternalError):
        Noise.calibrate(share.kind, 1, 0, share)
    with pytest.raises(InternalError):
        measure_counts(("a",), np.zeros(3, dtype=np.int64), share, 1)


@pytest.mark.parametrize("share", SHARES, ids=["pure", "zcdp"])
def test_release_adds_noise_of_the_calibrated_scale(share: PrivacyCost) -> None:
    mechanism = additive(share.kind, 1, share)
    draws = mechanism.release(np.zeros(40_000, dtype=np.int64))
    assert draws.dtype == np.int64
    check_scale(draws.astype(float), mechanism.name, mechanism.noise_scale)
