"""Laplace approximation: the posterior mode by L-BFGS and a Gaussian at it.

The optimizer loop runs in Python (SciPy's L-BFGS-B) around one jitted
value-and-gradient function, compiled once per model structure: no optimizer
loop is traced into XLA. A run that fails to converge (non-finite values, or the
iteration limit) restarts from a new random point, as in the paper. The
optimizer is preconditioned by the Gauss-Newton matrix (second derivatives of
log Z only). The Hessian at the mode is exact, by JAX (forward over reverse
mode), in batches of columns sized to a memory limit, each batch reported to
the progress display; its inverse is the covariance. An exact Hessian costs
about ``dim`` gradients, each O(dim^3) (a Cholesky factorization of the
likelihood's covariance): beyond ``EXACT_HESSIAN_MAX_DIM`` parameters the
Gauss-Newton matrix (the Fisher information of the likelihood's mean) is used
instead, and the fit's notes say so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular
from scipy import optimize

from dpsql.progress import Progress
from dpsql.synth.napsu_mq import model
from dpsql.synth.napsu_mq.evidence import Reduced
from dpsql.synth.napsu_mq.structure import Structure

HESSIAN_BATCH_BYTES = 256 * 2**20  # memory for one batch of Hessian columns
EXACT_HESSIAN_MAX_DIM = 400  # larger: the Gauss-Newton matrix (an exact one is O(dim^4))
HESSIAN_FLOOR = 1e-2  # the prior's curvature 1 / prior_sd^2 with the default prior_sd = 10
NEWTON_DECREMENT = 1e-8


@dataclass
class Laplace:
    """A Gaussian approximation N(mean, cov) of the posterior of ``phi``."""

    mean: np.ndarray
    cov: np.ndarray
    converged: bool
    iterations: int
    restarts: int
    grad_norm: float
    seconds: float  # for benchmarks, never described: a release records no timings
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        """JSON-able convergence record (no timings)."""
        return {"converged": self.converged, "iterations": self.iterations,
                "restarts": self.restarts, "grad_norm": self.grad_norm,
                "notes": list(self.notes)}


@lru_cache(maxsize=32)
def objective(structure: Structure) -> Any:
    """Jitted (negative log posterior, gradient) of ``(phi, evidence)`` for ``structure``."""
    return jax.jit(jax.value_and_grad(
        lambda phi, evidence: -model.log_posterior(structure, phi, evidence)))


def evidence_arrays(reduced: Reduced, prior_sd: float) -> model.Evidence:
    """The reduced evidence as float64 JAX arrays (call inside ``jax.enable_x64``)."""
    return model.Evidence(z=jnp.asarray(reduced.z), noise_cov=jnp.asarray(reduced.noise_cov),
                          n0=jnp.asarray(reduced.n0), n_scale=jnp.asarray(reduced.n_scale),
                          prior_sd=jnp.asarray(float(prior_sd)))


def fit(structure: Structure, reduced: Reduced, prior_sd: float, rng: np.random.Generator,
        progress: Progress, max_iter: int = 6000, restarts: int = 5) -> Laplace:
    """MAP by L-BFGS with restarts, then the Hessian there (call inside ``jax.enable_x64``)."""
    start = time.perf_counter()
    evidence = evidence_arrays(reduced, prior_sd)
    fn = objective(structure)
    dim = structure.dim + (1 if reduced.free_n else 0)

    def value_grad(x: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = fn(jnp.asarray(x), evidence)
        value = float(value)
        if not np.isfinite(value):
            return np.inf, np.zeros_like(x)
        return value, np.asarray(grad, dtype=np.float64)

    gn = gauss_newton(structure)

    def curvature(x: np.ndarray) -> np.ndarray:
        return np.asarray(gn(jnp.asarray(x), evidence))

    x0 = np.zeros(dim)
    x0[: structure.dim] = independent_start(structure, reduced)
    notes: list[str] = []
    done = [0]

    def tick(_: Any) -> None:
        done[0] += 1
        progress("laplace", done[0], None)

    best: tuple[float, np.ndarray] | None = None
    converged = False
    for attempt in range(restarts + 1):
        x, converged, message = _minimize(value_grad, curvature, x0, max_iter, tick)
        value = value_grad(x)[0]
        if best is None or value < best[0]:
            best = (value, x)
        if converged:
            break
        notes.append(f"attempt {attempt + 1}: {message}")
        x0 = rng.normal(0.0, 1.0, dim)
    assert best is not None
    x = best[1]
    if dim <= EXACT_HESSIAN_MAX_DIM:
        hessian = exact_hessian(structure, evidence, x, progress)
    else:
        hessian = curvature(x)
        notes.append(f"covariance from the Gauss-Newton matrix ({dim} parameters > "
                     f"{EXACT_HESSIAN_MAX_DIM}: an exact Hessian is O(dim^4))")
    cov, note = _inverse(hessian)
    if note:
        notes.append(note)
    _, grad = value_grad(x)
    restarted = sum(n.startswith("attempt") for n in notes)
    return Laplace(x, cov, converged, done[0], restarted,
                   float(np.max(np.abs(grad))), time.perf_counter() - start, notes)


def _minimize(value_grad: Any, curvature: Any, x0: np.ndarray, max_iter: int, tick: Any,
              rounds: int = 4) -> tuple[np.ndarray, bool, str]:
    """L-BFGS preconditioned by ``curvature`` (whitened coordinates), refreshed a few times.

    Rare cells leave directions that are orders of magnitude flatter than
    others; plain L-BFGS crawls along them for thousands of iterations. A short
    plain run gets near the mode, then each round whitens with the current
    Gauss-Newton matrix (eigenvalues floored) so the remaining problem is well conditioned.
    Converged when the Newton decrement g^T H^-1 g is negligible.
    """
    used = 0
    result = optimize.minimize(value_grad, x0, jac=True, method="L-BFGS-B", callback=tick,
                               options={"maxiter": min(200, max_iter), "maxcor": 20})
    x, used = result.x, int(result.nit)
    if not np.isfinite(result.fun):
        return x, False, "non-finite posterior at the start point"
    for _ in range(rounds):
        values, vectors = np.linalg.eigh(curvature(x))
        scale = vectors / np.sqrt(np.maximum(np.abs(values), HESSIAN_FLOOR))

        def whitened(y: np.ndarray, x: np.ndarray = x, scale: np.ndarray = scale
                     ) -> tuple[float, np.ndarray]:
            value, grad = value_grad(x + scale @ y)
            return value, scale.T @ grad

        result = optimize.minimize(whitened, np.zeros_like(x), jac=True, method="L-BFGS-B",
                                   callback=tick, options={"maxiter": max(1, max_iter - used),
                                                           "maxcor": 20, "ftol": 1e-15,
                                                           "gtol": 1e-7})
        x, used = x + scale @ result.x, used + int(result.nit)
        value, grad = value_grad(x)
        decrement = float(np.sum((scale.T @ grad) ** 2))
        if np.isfinite(value) and decrement < NEWTON_DECREMENT:
            return x, True, ""
        if used >= max_iter:
            return x, False, f"iteration limit {max_iter} reached"
    return x, False, f"Newton decrement {decrement:.2g} after {rounds} preconditioned rounds"


def independent_start(structure: Structure, reduced: Reduced) -> np.ndarray:
    """The theta of the independence model matching the estimated 1-way marginals.

    For a single column the canonical features are [x_j = v], v >= 1, whose means
    are P(x_j = v): their log-odds against the reference value 0 start L-BFGS
    close to the mode (pairs start at 0). Uses only the reduced (DP) evidence.
    """
    theta = np.zeros(structure.dim)
    floor = 0.5 / max(reduced.n0, 1.0)
    for scope, start in structure.offsets.items():
        if len(scope) != 1:
            continue
        k = structure.sizes[scope[0]] - 1
        p = np.clip(reduced.z[1 + start: 1 + start + k] / reduced.n0, floor, 1.0)
        p0 = max(1.0 - p.sum(), floor)
        theta[start: start + k] = np.log(p / p0)
    return theta


@lru_cache(maxsize=32)
def gauss_newton(structure: Structure) -> Any:
    """Jitted Gauss-Newton matrix J' C^-1 J + prior of ``(phi, evidence)``, a preconditioner.

    J is the Jacobian of the likelihood's mean n [1, mu(theta)] (second
    derivatives of log Z), C the likelihood's covariance: the curvature of the
    log posterior without the terms that differentiate C, which are small near
    the mode and cost third and fourth derivatives.
    """
    def matrix(phi: jax.Array, evidence: model.Evidence) -> jax.Array:
        def mean(p: jax.Array) -> jax.Array:
            mu = jax.grad(lambda t: model.log_z(structure, t))(p[: structure.dim])
            return model.records(structure, p, evidence) * jnp.concatenate(
                [jnp.ones(1, mu.dtype), mu])
        jac = jax.jacfwd(mean)(phi)
        chol = jnp.linalg.cholesky(model.likelihood_covariance(structure, phi, evidence))
        white = solve_triangular(chol, jac, lower=True)
        prior = jnp.zeros(phi.shape[0], phi.dtype).at[: structure.dim].set(
            1 / evidence.prior_sd**2)
        return white.T @ white + jnp.diag(prior)
    return jax.jit(matrix)


@lru_cache(maxsize=32)
def hessian_columns(structure: Structure) -> Any:
    """Jitted ``(phi, evidence, directions) -> H @ directions.T`` of the negative log posterior.

    Forward mode over the compiled reverse-mode gradient, one tangent per
    direction (vmapped): exact, and one compile per structure and batch size.
    """
    grad = jax.grad(lambda phi, evidence: -model.log_posterior(structure, phi, evidence))

    def columns(phi: jax.Array, evidence: model.Evidence, directions: jax.Array) -> jax.Array:
        return jax.vmap(lambda v: jax.jvp(lambda p: grad(p, evidence), (phi,), (v,))[1],
                        out_axes=1)(directions)
    return jax.jit(columns)


def hessian_batch(dim: int) -> int:
    """Hessian columns per batch: a column's graph holds a few dim x dim matrices."""
    return int(min(dim, max(1, HESSIAN_BATCH_BYTES // (4 * 8 * dim * dim))))


def exact_hessian(structure: Structure, evidence: model.Evidence, x: np.ndarray,
                  progress: Progress) -> np.ndarray:
    """The Hessian of the negative log posterior at ``x`` by autodiff, batch by batch."""
    dim = x.size
    batch = hessian_batch(dim)
    columns = hessian_columns(structure)
    phi = jnp.asarray(x)
    out = np.empty((dim, dim))
    progress("laplace hessian", 0, dim)  # the first batch compiles: show the stage at once
    for start in range(0, dim, batch):
        stop = min(dim, start + batch)
        directions = np.zeros((batch, dim))  # a fixed shape: one compile per structure
        directions[np.arange(stop - start), np.arange(start, stop)] = 1.0
        out[:, start:stop] = np.asarray(columns(phi, evidence, jnp.asarray(directions))
                                        )[:, : stop - start]
        progress("laplace hessian", stop, dim)
    return (out + out.T) / 2


def _inverse(hessian: np.ndarray) -> tuple[np.ndarray, str]:
    """The covariance: H^-1, or with eigenvalues floored when H is not positive definite."""
    try:
        chol = np.linalg.cholesky(hessian)
        inv = np.linalg.solve(chol, np.eye(hessian.shape[0]))
        return inv.T @ inv, ""
    except np.linalg.LinAlgError:
        values, vectors = np.linalg.eigh(hessian)
        floor = max(float(values.max()) * 1e-10, 1e-10)
        clipped = np.maximum(values, floor)
        return (vectors / clipped) @ vectors.T, "Hessian not positive definite at the mode; " \
            f"{int((values < floor).sum())} eigenvalues floored"
