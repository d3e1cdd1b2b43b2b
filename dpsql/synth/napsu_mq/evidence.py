"""Noisy marginals -> the sufficient evidence the likelihood needs.

Every measured cell is a linear function of ``[1, b(x)]`` summed over records
(:func:`cell_map`): ``s~ = G' y + e`` with ``y = [n, sum_i b(x_i)]`` and
independent noise ``e`` of per-measurement variance. Weighted least squares
gives ``z = (G'^T W G')^-1 G'^T W s~``; the residual is independent of ``z`` and
its law does not depend on the parameters, so ``z`` with noise covariance
``(G'^T W G')^-1`` carries all the information about ``(theta, n)``. With one
measurement per clique this reduces to the paper's likelihood; measurements
that overlap (MST's 1-way marginals, shared columns) are all used.

The discrete Gaussian with parameter sigma^2 has variance at most sigma^2; like
the paper we use sigma^2 as the noise variance (conservative: intervals are at
worst slightly wide).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpsql.errors import ConfigurationError
from dpsql.synth.napsu_mq.structure import Structure, cell_map

#: Variance used for noise-free measurements (an infinite budget), in counts^2.
MIN_VARIANCE = 1e-4


@dataclass(frozen=True)
class Observed:
    """One noisy marginal: its scope (column indices), cells and noise variance per cell."""

    scope: tuple[int, ...]
    noisy: np.ndarray
    variance: float


@dataclass(frozen=True)
class Reduced:
    """The reduced evidence: ``z``, its noise covariance, and how n is handled."""

    z: np.ndarray
    noise_cov: np.ndarray
    n0: float
    n_scale: float  # 0 when the number of records is public

    @property
    def free_n(self) -> bool:
        """Whether the number of records is a posterior parameter (not public)."""
        return self.n_scale > 0


def reduce(structure: Structure, observed: Sequence[Observed],
           public_rows: int | None = None) -> Reduced:
    """Weighted least squares of ``[n, sum b]`` from every noisy cell."""
    dim = structure.dim + 1
    info = np.zeros((dim, dim))
    rhs = np.zeros(dim)
    for obs in observed:
        design = cell_map(structure, obs.scope)
        weight = 1.0 / max(obs.variance, MIN_VARIANCE)
        info += weight * design.T @ design
        rhs += weight * design.T @ obs.noisy.reshape(-1).astype(np.float64)
    try:
        chol = np.linalg.cholesky(info)
    except np.linalg.LinAlgError as err:
        raise ConfigurationError("the measurements do not determine every model parameter; "
                                 "measure every clique of the model") from err
    inv_chol = np.linalg.solve(chol, np.eye(dim))
    noise_cov = inv_chol.T @ inv_chol
    z = noise_cov @ rhs
    if public_rows is not None:
        return Reduced(z, noise_cov, float(public_rows), 0.0)
    return Reduced(z, noise_cov, max(float(z[0]), 1.0), float(np.sqrt(noise_cov[0, 0])))
