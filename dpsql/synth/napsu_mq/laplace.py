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


@dataclass
class Laplace:
    """A Gaussian approximation N(mean, cov) of the posterior of ``phi``."""

    mean: np.ndarray
    cov: np.ndarray
    converged: bool
    iterations: int
    restarts: int
    grad_norm: float
    seconds: float
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        """JSON-able convergence record."""
        return {"converged": self.converged, "iterations": self.iterations,
                "restarts": self.restarts, "grad_norm": self.grad_norm,
                "seconds": round(self.seconds, 3), "notes": list(self.notes)}


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
    notes: list[str] = []
    best = None
    iterations = 0
    done = [0]

    def tick(_: Any) -> None:
        done[0] += 1
        progress("laplace", done[0], None)

    for attempt in range(restarts + 1):

        result = optimize.minimize(value_grad, x0, jac=True, method="L-BFGS-B", callback=tick,
                                   options={"maxiter": max_iter, "maxcor": 20, "ftol": 1e-13,
                                            "gtol": 1e-6})
        iterations += int(result.nit)
        ok = bool(np.isfinite(result.fun)) and (result.success or result.status == 2)
        if best is None or (np.isfinite(result.fun) and result.fun < best.fun):
            best = result
        if ok:
            break
        notes.append(f"attempt {attempt + 1}: {result.message}")
        x0 = rng.normal(0.0, 1.0, dim)
    assert best is not None
    restarts_used = len(notes)
    hessian = _hessian(value_grad, best.x)
    cov, note = _inverse(hessian)
    if note:
        notes.append(note)
    _, grad = value_grad(best.x)
    converged = bool(np.isfinite(best.fun)) and (best.success or best.status == 2)
    return Laplace(best.x, cov, converged, iterations, restarts_used,
                   float(np.max(np.abs(grad))), time.perf_counter() - start, notes)


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
