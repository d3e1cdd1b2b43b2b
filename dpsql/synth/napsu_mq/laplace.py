"""Laplace approximation: the posterior mode by L-BFGS and a Gaussian at it.

The optimizer loop runs in Python (SciPy's L-BFGS-B) around one jitted
value-and-gradient function, compiled once per model structure: no optimizer
loop is traced into XLA. A run that fails to converge (non-finite values, or the
iteration limit) restarts from a new random point, as in the paper. The
Hessian at the mode comes from central differences of the same compiled
gradient (no fourth-derivative graph to compile); its inverse is the covariance.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize

from dpsql.progress import Progress
from dpsql.synth.napsu_mq import model
from dpsql.synth.napsu_mq.evidence import Reduced
from dpsql.synth.napsu_mq.structure import Structure

HESSIAN_STEP = 1e-4
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
        x, converged, message = _minimize(value_grad, x0, max_iter, tick)
        value = value_grad(x)[0]
        if best is None or value < best[0]:
            best = (value, x)
        if converged:
            break
        notes.append(f"attempt {attempt + 1}: {message}")
        x0 = rng.normal(0.0, 1.0, dim)
    assert best is not None
    x = best[1]
    hessian = _hessian(value_grad, x)
    cov, note = _inverse(hessian)
    if note:
        notes.append(note)
    _, grad = value_grad(x)
    return Laplace(x, cov, converged, done[0], len(notes) - (1 if note else 0),
                   float(np.max(np.abs(grad))), time.perf_counter() - start, notes)


def _minimize(value_grad: Any, x0: np.ndarray, max_iter: int, tick: Any,
              rounds: int = 4) -> tuple[np.ndarray, bool, str]:
    """L-BFGS preconditioned by the Hessian (whitened coordinates), refreshed a few times.

    Rare cells leave directions that are orders of magnitude flatter than
    others; plain L-BFGS crawls along them for thousands of iterations. A short
    plain run gets near the mode, then each round whitens with the current
    Hessian (eigenvalues floored) so the remaining problem is well conditioned.
    Converged when the Newton decrement g^T H^-1 g is negligible.
    """
    used = 0
    result = optimize.minimize(value_grad, x0, jac=True, method="L-BFGS-B", callback=tick,
                               options={"maxiter": min(200, max_iter), "maxcor": 20})
    x, used = result.x, int(result.nit)
    if not np.isfinite(result.fun):
        return x, False, "non-finite posterior at the start point"
    for _ in range(rounds):
        values, vectors = np.linalg.eigh(_hessian(value_grad, x))
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


def _hessian(value_grad: Any, x: np.ndarray) -> np.ndarray:
    """Central differences of the gradient, symmetrized."""
    dim = x.size
    out = np.empty((dim, dim))
    for i in range(dim):
        step = np.zeros(dim)
        step[i] = HESSIAN_STEP
        out[:, i] = (value_grad(x + step)[1] - value_grad(x - step)[1]) / (2 * HESSIAN_STEP)
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
