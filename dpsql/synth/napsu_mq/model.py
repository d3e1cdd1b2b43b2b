"""The max-entropy model in JAX: log Z, its moments, and the noise-aware log posterior.

``log Z(theta)`` is computed exactly by one upward pass of sum-product message
passing on the junction tree, in log space. Its gradient is the vector of
feature means ``mu(theta)`` and its Hessian the feature covariance
``Sigma(theta)``; JAX differentiates the pass (reverse mode for ``mu``, forward
over reverse for ``Sigma``), so no hand-written downward pass is needed.

Every function here takes the :class:`Structure` as a static argument and the
data as traced arguments: each is compiled once per model structure and reused
across fits, chains and copies. Callers run them inside ``jax.enable_x64(True)``
(float64); nothing here touches JAX's global configuration.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular
from jax.scipy.special import logsumexp

from dpsql.synth.napsu_mq.structure import Structure


class Evidence(NamedTuple):
    """What the likelihood needs from the noisy measurements (all DP).

    ``z`` is the generalized-least-squares estimate of ``[n, sum_i b(x_i)]``
    (the total and the canonical sufficient statistics) from every noisy cell,
    ``noise_cov`` its noise covariance ``(G' W G)^-1``. The number of records is
    ``n0 + n_scale * phi[-1]`` when it is unknown (``n_scale`` > 0), else ``n0``.
    """

    z: jax.Array
    noise_cov: jax.Array
    n0: jax.Array
    n_scale: jax.Array
    prior_sd: jax.Array


def potentials(structure: Structure, theta: jax.Array) -> list[jax.Array]:
    """Log-potential table of each junction-tree clique for parameters ``theta``.

    A scope's parameters form a block over the non-reference values; padding a
    zero for value 0 on each axis and broadcasting into the clique adds it to
    every cell it covers. Slices, pads and broadcasts keep every derivative
    cheap (a gather would turn into a slow scatter-add under differentiation).
    """
    tables = []
    for i, clique in enumerate(structure.tree):
        shape = structure.tree_shape(i)
        table = jnp.zeros(shape, theta.dtype)
        for scope in structure.assigned[i]:
            start = structure.offsets[scope]
            block = theta[start:start + structure.scope_features(scope)]
            block = block.reshape(tuple(structure.sizes[j] - 1 for j in scope))
            block = jnp.pad(block, [(1, 0)] * len(scope))
            table = table + block.reshape(
                tuple(structure.sizes[j] if j in scope else 1 for j in clique))
        tables.append(table)
    return tables


def log_z_of_potentials(structure: Structure, tables: list[jax.Array]) -> jax.Array:
    """Log sum_x exp(sum_C psi_C(x_C)): leaves send log-sum-exp messages to the roots."""
    beliefs = list(tables)
    total = jnp.zeros((), tables[0].dtype)
    for i in reversed(range(len(structure.tree))):
        parent = structure.parent[i]
        if parent < 0:
            total = total + logsumexp(beliefs[i])
            continue
        clique, separator = structure.tree[i], structure.separator(i)
        away = tuple(a for a, j in enumerate(clique) if j not in separator)
        message = logsumexp(beliefs[i], axis=away)
        target = structure.tree[parent]
        shape = tuple(structure.sizes[j] if j in separator else 1 for j in target)
        beliefs[parent] = beliefs[parent] + message.reshape(shape)
    return total


def log_z(structure: Structure, theta: jax.Array) -> jax.Array:
    """The log partition function."""
    return log_z_of_potentials(structure, potentials(structure, theta))


def clique_marginals(structure: Structure, theta: jax.Array) -> list[jax.Array]:
    """P_theta's marginal table on every junction-tree clique (d log Z / d psi)."""
    grad = jax.grad(lambda tables: log_z_of_potentials(structure, tables))
    return list(grad(potentials(structure, theta)))


def moments(structure: Structure, theta: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Feature mean ``mu`` (gradient of log Z) and covariance ``Sigma`` (its Hessian)."""
    grad = jax.grad(lambda t: log_z(structure, t))
    sigma, mu = jax.jacfwd(lambda t: (grad(t), grad(t)), has_aux=True)(theta)
    return mu, sigma


def records(structure: Structure, phi: jax.Array, evidence: Evidence) -> jax.Array:
    """The number of records n for the parameter vector ``phi``."""
    if phi.shape[0] == structure.dim:
        return evidence.n0
    return evidence.n0 + evidence.n_scale * phi[structure.dim]


@jax.custom_vjp
def gaussian_log_density(cov: jax.Array, residual: jax.Array) -> jax.Array:
    """The log density N(residual; 0, cov) up to a constant, from one Cholesky factorization.

    The custom gradient ``(alpha alpha^T - cov^-1) / 2`` (alpha = cov^-1 residual)
    costs one triangular inverse, cheaper than differentiating the factorization.
    """
    return _gaussian_forward(cov, residual)[0]


def _gaussian_forward(cov: jax.Array, residual: jax.Array) -> tuple[jax.Array, Any]:
    chol = jnp.linalg.cholesky(cov)
    white = solve_triangular(chol, residual, lower=True)
    alpha = solve_triangular(chol, white, lower=True, trans=1)
    return -0.5 * white @ white - jnp.log(jnp.diagonal(chol)).sum(), (chol, alpha)


def _gaussian_backward(saved: Any, cotangent: jax.Array) -> tuple[jax.Array, jax.Array]:
    chol, alpha = saved
    inverse_chol = solve_triangular(chol, jnp.eye(chol.shape[0], dtype=chol.dtype), lower=True)
    inverse = inverse_chol.T @ inverse_chol
    return cotangent * 0.5 * (jnp.outer(alpha, alpha) - inverse), -cotangent * alpha


gaussian_log_density.defvjp(_gaussian_forward, _gaussian_backward)


def _padded(sigma: jax.Array) -> jax.Array:
    """``[0, Sigma]``: the total n has no sampling variance given n."""
    edge = jnp.zeros((1, sigma.shape[0]), sigma.dtype)
    return jnp.block([[jnp.zeros((1, 1), sigma.dtype), edge], [edge.T, sigma]])


def _expected(n: jax.Array, mu: jax.Array) -> jax.Array:
    """``n [1, mu]``: the expected total and sufficient statistics."""
    return n * jnp.concatenate([jnp.ones(1, mu.dtype), mu])


def log_likelihood(structure: Structure, phi: jax.Array, evidence: Evidence) -> jax.Array:
    """The CLT likelihood N(z; n [1, mu], n [0, Sigma] + noise_cov), DP noise included."""
    n = records(structure, phi, evidence)
    mu, sigma = moments(structure, phi[: structure.dim])
    return gaussian_log_density(evidence.noise_cov + n * _padded(sigma),
                                evidence.z - _expected(n, mu))


def likelihood_covariance(structure: Structure, phi: jax.Array, evidence: Evidence
                          ) -> jax.Array:
    """The likelihood's covariance ``n [0, Sigma] + noise_cov`` at ``phi``."""
    _, sigma = moments(structure, phi[: structure.dim])
    return evidence.noise_cov + records(structure, phi, evidence) * _padded(sigma)


def log_likelihood_plugin(structure: Structure, phi: jax.Array, evidence: Evidence,
                          chol: jax.Array) -> jax.Array:
    """The CLT likelihood with its covariance fixed (``chol`` its Cholesky factor).

    An optional approximation for speed (``covariance=mode``): only the mean
    ``n [1, mu(theta)]`` moves with ``phi``, so a gradient needs second
    derivatives of log Z instead of third.
    """
    mu = jax.grad(lambda t: log_z(structure, t))(phi[: structure.dim])
    residual = evidence.z - _expected(records(structure, phi, evidence), mu)
    white = solve_triangular(chol, residual, lower=True)
    return -0.5 * white @ white


def log_prior(structure: Structure, phi: jax.Array, evidence: Evidence) -> jax.Array:
    """Theta ~ N(0, prior_sd^2 I); a flat prior on the number of records."""
    theta = phi[: structure.dim]
    return -0.5 * (theta @ theta) / evidence.prior_sd**2


def log_posterior(structure: Structure, phi: jax.Array, evidence: Evidence) -> jax.Array:
    """Unnormalized log posterior of ``phi = [theta, (n - n0) / n_scale]``."""
    return log_likelihood(structure, phi, evidence) + log_prior(structure, phi, evidence)


def log_posterior_plugin(structure: Structure, phi: jax.Array, evidence: Evidence,
                         chol: jax.Array) -> jax.Array:
    """:func:`log_posterior` with the likelihood's covariance fixed (see the plug-in likelihood)."""
    return (log_likelihood_plugin(structure, phi, evidence, chol)
            + log_prior(structure, phi, evidence))


@lru_cache(maxsize=32)
def compiled_marginals(structure: Structure) -> Any:
    """Jitted ``theta -> clique marginals`` for ``structure`` (compiled once, reused per copy)."""
    return jax.jit(lambda theta: clique_marginals(structure, theta))
