"""NUTS (NumPyro) on the posterior whitened by the Laplace approximation.

``phi = mean + L u`` with ``L L^T`` the Laplace covariance, so NUTS samples
``u``, a near-standard-normal target. The kernels come from NumPyro's
functional ``hmc(potential_fn_gen=...)``: data enter as traced arguments, so
the jitted chunk below compiles once per model structure and is reused by
every chain, every chunk and every later fit of the same structure.

Chains run independently, on up to ``workers`` threads (a compiled call
releases the GIL, so two chains use two cores). They are not vectorized: NUTS
trees differ in size from chain to chain, and a vectorized (vmapped) step
runs every chain until the longest tree ends, so it costs the maximum tree
size times the number of chains, where independent chains cost the sum (and
on CPU a vmapped leapfrog step is no cheaper per chain). Each chain runs in
chunks of ``CHUNK`` iterations so that progress is reported while it runs.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from numpyro.infer.hmc import hmc
from numpyro.infer.util import ParamInfo

from dpsql.progress import Progress
from dpsql.synth.napsu_mq import model
from dpsql.synth.napsu_mq.evidence import Reduced
from dpsql.synth.napsu_mq.laplace import Laplace, evidence_arrays
from dpsql.synth.napsu_mq.structure import Structure

CHUNK = 25  # iterations per compiled call (progress granularity)
# Chains start at the Laplace mode plus N(0, INIT_SPREAD^2) in whitened units: a full
# N(0, I) start puts prior-dominated logits of near-empty cells far beyond the
# likelihood's wall, where gradients are huge and early warmup crawls.
INIT_SPREAD = 0.1


@dataclass
class Draws:
    """Posterior draws of ``phi`` per chain, and the sampler's diagnostics."""

    phi: np.ndarray  # (chains, samples, dim)
    diagnostics: dict[str, Any]


def _potential_gen(structure: Structure, covariance: str) -> Any:
    """Potential of ``u`` given (evidence, Laplace mean, its Cholesky, likelihood Cholesky).

    The last argument is used only with ``covariance="mode"`` (the likelihood's
    covariance fixed at the Laplace mode).
    """
    def make(evidence: model.Evidence, mean: jax.Array, chol: jax.Array,
             likelihood_chol: jax.Array) -> Any:
        def potential(u: jax.Array) -> jax.Array:
            phi = mean + chol @ u
            if covariance == "mode":
                return -model.log_posterior_plugin(structure, phi, evidence, likelihood_chol)
            return -model.log_posterior(structure, phi, evidence)
        return potential
    return make


@lru_cache(maxsize=16)
def _kernels(structure: Structure, covariance: str) -> tuple[Any, Any, Any]:
    """(init kernel, jitted chunk runner, jitted potential value-and-grad) for ``structure``."""
    make = _potential_gen(structure, covariance)
    init_kernel, sample_kernel = hmc(potential_fn_gen=make, algo="NUTS")

    def run(state: Any, *args: Any) -> Any:
        def step(state: Any, _: Any) -> tuple[Any, Any]:
            state = sample_kernel(state, model_args=args)
            return state, (state.z, state.num_steps, state.diverging, state.accept_prob)

        return jax.lax.scan(step, state, None, length=CHUNK)

    value_grad = jax.jit(lambda u, *args: jax.value_and_grad(make(*args))(u))
    return init_kernel, jax.jit(run), value_grad


def sample(structure: Structure, reduced: Reduced, laplace: Laplace, prior_sd: float, *,
           chains: int, warmup: int, samples: int, max_tree_depth: int, target_accept: float,
           rng: np.random.Generator, progress: Progress, workers: int = 0,
           covariance: str = "exact") -> Draws:
    """Run ``chains`` NUTS chains on ``workers`` threads (0: one per core), float64.

    ``covariance="mode"`` fixes the likelihood's covariance at the Laplace mode
    (an optional approximation, see :func:`model.log_likelihood_plugin`).
    """
    started = time.perf_counter()
    workers = min(chains, workers or os.cpu_count() or 1)
    with jax.enable_x64(True):
        evidence = evidence_arrays(reduced, prior_sd)
        mean = jnp.asarray(laplace.mean)
        chol = jnp.asarray(_cholesky(laplace.cov))
        likelihood_chol = jnp.eye(1)
        if covariance == "mode":
            likelihood_chol = jnp.linalg.cholesky(
                _likelihood_covariance(structure)(mean, evidence))
    init_kernel, run, value_grad = _kernels(structure, covariance)
    args = (evidence, mean, chol, likelihood_chol)
    dim = laplace.mean.size
    starts = [rng.normal(0.0, INIT_SPREAD, dim) for _ in range(chains)]
    keys = [int(rng.integers(2**31)) for _ in range(chains)]
    total = warmup + samples
    chunks = -(-total // CHUNK)
    lock = threading.Lock()
    done = [0]

    def chain(i: int) -> dict[str, Any]:
        # enable_x64 is thread-local: every worker thread enters it itself.
        with jax.enable_x64(True):
            u0 = jnp.asarray(starts[i])
            pe, grad = value_grad(u0, *args)
            state = init_kernel(ParamInfo(u0, pe, grad), warmup,
                                rng_key=jax.random.key(keys[i]),
                                model_args=args,
                                max_tree_depth=max_tree_depth,
                                target_accept_prob=target_accept)
            parts: list[tuple[np.ndarray, ...]] = []
            seconds: list[float] = []
            for k in range(chunks):
                t0 = time.perf_counter()
                state, out = run(state, *args)
                parts.append(tuple(np.asarray(x) for x in out))
                seconds.append(time.perf_counter() - t0)
                with lock:
                    done[0] += min(CHUNK, total - k * CHUNK)
                    stage = done[0] / chains
                    if stage <= warmup:
                        progress("nuts warmup", stage, warmup)
                    else:
                        progress("nuts sampling", stage - warmup, samples)
            z, steps, div, acc = (np.concatenate(x)[:total] for x in zip(*parts, strict=True))
            return {"u": z[warmup:], "steps": steps, "divergent": div[warmup:],
                    "accept": acc[warmup:], "step_size": float(state.adapt_state.step_size),
                    "first_chunk": seconds[0],
                    # After the first chunk (which includes compilation):
                    "steady_seconds": sum(seconds[1:]), "steady_steps": int(steps[CHUNK:].sum())}

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(chain, range(chains)))
    u = np.stack([r["u"] for r in results])
    n_steps = np.stack([r["steps"] for r in results])
    phi = laplace.mean + u @ np.asarray(chol).T
    rhat = np.asarray(split_gelman_rubin(phi)) if chains > 1 else np.full(dim, np.nan)
    ess = np.asarray(effective_sample_size(phi))
    seconds = time.perf_counter() - started
    diagnostics = {
        "chains": chains, "warmup": warmup, "samples": samples, "workers": workers,
        "max_tree_depth": max_tree_depth, "target_accept": target_accept,
        "covariance": covariance,
        "max_rhat": float(np.nanmax(rhat)) if chains > 1 else None,
        "min_ess": float(np.min(ess)),
        "divergences": int(sum(r["divergent"].sum() for r in results)),
        "mean_accept_prob": float(np.mean([r["accept"].mean() for r in results])),
        "step_size": [r["step_size"] for r in results],
        "leapfrog_steps": {"warmup": int(n_steps[:, :warmup].sum()),
                           "sampling": int(n_steps[:, warmup:].sum()),
                           "mean_per_iteration": float(n_steps[:, warmup:].mean()),
                           "max_per_iteration": int(n_steps.max())},
        # Wall time per leapfrog step of one chain, compilation excluded; with several
        # workers the chains share the cores, so this is not the per-core cost.
        "ms_per_leapfrog_step": round(1e3 * sum(r["steady_seconds"] for r in results)
                                      / max(1, sum(r["steady_steps"] for r in results)), 3),
        "seconds": round(seconds, 3),
        "compile_and_first_chunk_seconds": round(max(r["first_chunk"] for r in results), 3),
    }
    return Draws(phi, diagnostics)


@lru_cache(maxsize=16)
def _likelihood_covariance(structure: Structure) -> Any:
    """Jitted ``(phi, evidence) -> the likelihood's covariance`` for ``structure``."""
    return jax.jit(lambda phi, evidence: model.likelihood_covariance(structure, phi, evidence))


def _cholesky(cov: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        values, vectors = np.linalg.eigh((cov + cov.T) / 2)
        return vectors * np.sqrt(np.maximum(values, 1e-12))
