"""Importance resampling of Laplace draws follows the target density, not the Gaussian."""

from __future__ import annotations

import numpy as np

from dpsql.synth.napsu_mq.resample import resample


def gamma2(points: np.ndarray) -> np.ndarray:
    """Unnormalized log density of Gamma(shape 2, scale 1): x e^-x on x > 0 (mean 2, var 2)."""
    x = points[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, np.log(x) - x, -np.inf)


def test_resampled_draws_follow_a_one_sided_target() -> None:
    """The Gaussian N(3, 2^2) puts 7% of its mass below 0 and has mean 3; the kept draws must
    have none below 0 and Gamma(2)'s mean 2 and variance 2. The resampling error of the mean
    is about 0.03 here, so the tolerance of 0.2 is over 6 sds (false-positive rate < 1e-9;
    the seed fixes it anyway); unweighted draws miss by 1."""
    rng = np.random.default_rng(5)
    draws, ess = resample(gamma2, np.array([3.0]), np.array([[4.0]]), rng, keep=5000,
                          proposals=40_000)
    assert draws.shape == (5000, 1)
    assert (draws > 0).all()
    assert abs(draws.mean() - 2) < 0.2
    assert abs(draws.var() - 2) < 0.5
    assert 5_000 < ess < 40_000  # a fair fit: most proposals count, not all


def test_effective_sample_size_falls_with_a_poor_proposal() -> None:
    rng = np.random.default_rng(6)
    _, good = resample(gamma2, np.array([2.0]), np.array([[2.0]]), rng, keep=100, proposals=4000)
    _, poor = resample(gamma2, np.array([15.0]), np.array([[1.0]]), rng, keep=100,
                       proposals=4000)  # far in the tail: a few proposals carry the weight
    assert poor < 100 < 2000 < good  # seeds 0-5 gave 5-46 and 2,736-3,182
