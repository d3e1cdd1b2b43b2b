"""NUTS (NumPyro) on the posterior whitened by the Laplace approximation.

``phi = mean + L u`` with ``L L^T`` the Laplace covariance, so NUTS samples
``u``, a near-standard-normal target. The kernels come from NumPyro's
functional ``hmc(potential_fn_gen=...)``: data enter as traced arguments, so
the jitted chunk below compiles once per model structure and warmup length and
is reused by every chain (vmapped: one compiled step advances all chains) and
every later fit of the same structure. The Python loop runs the chain in chunks
so progress is reported while it runs.
"""

from __future__ import annotations

import time
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

CHUNK = 50  # iterations per compiled call (progress granularity)
# Chains start at the Laplace mode plus N(0, INIT_SPREAD^2) in whitened units: a full
# N(0, I) start puts prior-dominated logits of near-empty cells far beyond the
# likelihood's wall, where gradients are huge and early warmup crawls.
INIT_SPREAD = 0.1


@dataclass
class Draws:
    """Posterior draws of ``phi`` per chain, and the sampler's diagnostics."""

    phi: np.ndarray  # (chains, samples, dim)
    diagnostics: dict[str, Any]


def _potential_gen(structure: Structure) -> Any:
    def make(evidence: model.Evidence, mean: jax.Array, chol: jax.Array) -> Any:
        def potential(u: jax.Array) -> jax.Array:
            return -model.log_posterior(structure, mean + chol @ u, evidence)
        return potential
    return make


@lru_cache(maxsize=16)
def _kernels(structure: Structure, warmup: int, max_tree_depth: int,
             target_accept: float) -> tuple[Any, Any, Any]:
    """(init, jitted chunk runner, jitted potential value-and-grad) for one configuration."""
    make = _potential_gen(structure)
    init_kernel, sample_kernel = hmc(potential_fn_gen=make, algo="NUTS")
    settings = {"max_tree_depth": max_tree_depth, "target_accept_prob": target_accept}

    def run(states: Any, evidence: model.Evidence, mean: jax.Array, chol: jax.Array) -> Any:
        def step(state: Any, _: Any) -> tuple[Any, Any]:
            state = sample_kernel(state, model_args=(evidence, mean, chol))
            return state, (state.z, state.num_steps, state.diverging, state.accept_prob,
                           state.potential_energy)

        return jax.vmap(lambda s: jax.lax.scan(step, s, None, length=CHUNK))(states)

    value_grad = jax.jit(lambda u, evidence, mean, chol: jax.value_and_grad(
        make(evidence, mean, chol))(u))
    return (init_kernel, settings), jax.jit(run), value_grad


def sample(structure: Structure, reduced: Reduced, laplace: Laplace, prior_sd: float, *,
           chains: int, warmup: int, samples: int, max_tree_depth: int, target_accept: float,
           rng: np.random.Generator, progress: Progress) -> Draws:
    """Run ``chains`` NUTS chains (call inside ``jax.enable_x64``)."""
    started = time.perf_counter()
    evidence = evidence_arrays(reduced, prior_sd)
    mean = jnp.asarray(laplace.mean)
    chol = jnp.asarray(_cholesky(laplace.cov))
    (init_kernel, settings), run, value_grad = _kernels(structure, warmup, max_tree_depth,
                                                         target_accept)
    dim = laplace.mean.size
    states = []
    for _ in range(chains):
        u0 = jnp.asarray(rng.normal(0.0, INIT_SPREAD, dim))
        pe, grad = value_grad(u0, evidence, mean, chol)
        key = jax.random.key(int(rng.integers(2**31)))
        states.append(init_kernel(ParamInfo(u0, pe, grad), warmup, rng_key=key,
                                  model_args=(evidence, mean, chol), **settings))
    state = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    total = warmup + samples
    chunks = -(-total // CHUNK)
    zs, steps, divergent, accept = [], [], [], []
    timing = {"compile_and_first_chunk": 0.0}
    for k in range(chunks):
        t0 = time.perf_counter()
        state, (z, n_steps, div, acc, _) = run(state, evidence, mean, chol)
        z = np.asarray(z)
        if k == 0:
            timing["compile_and_first_chunk"] = time.perf_counter() - t0
        zs.append(z)
        steps.append(np.asarray(n_steps))
        divergent.append(np.asarray(div))
        accept.append(np.asarray(acc))
        done = min((k + 1) * CHUNK, total)
        if done <= warmup:
            progress("nuts warmup", done, warmup)
        else:
            progress("nuts sampling", done - warmup, samples)
    u = np.concatenate(zs, axis=1)[:, warmup:total]
    n_steps = np.concatenate(steps, axis=1)[:, :total]
    div = np.concatenate(divergent, axis=1)[:, warmup:total]
    acc = np.concatenate(accept, axis=1)[:, warmup:total]
    phi = laplace.mean + u @ np.asarray(chol).T
    rhat = np.asarray(split_gelman_rubin(phi)) if chains > 1 else np.full(dim, np.nan)
    ess = np.asarray(effective_sample_size(phi))
    seconds = time.perf_counter() - started
    diagnostics = {
        "chains": chains, "warmup": warmup, "samples": samples,
        "max_rhat": float(np.nanmax(rhat)) if chains > 1 else None,
        "min_ess": float(np.min(ess)),
        "divergences": int(div.sum()),
        "mean_accept_prob": float(acc.mean()),
        "step_size": [float(s) for s in np.asarray(state.adapt_state.step_size)],
        "leapfrog_steps": {"warmup": int(n_steps[:, :warmup].sum()),
                           "sampling": int(n_steps[:, warmup:].sum()),
                           "mean_per_iteration": float(n_steps[:, warmup:].mean())},
        "seconds": round(seconds, 3),
        "compile_and_first_chunk_seconds": round(timing["compile_and_first_chunk"], 3),
    }
    return Draws(phi, diagnostics)


def _cholesky(cov: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        values, vectors = np.linalg.eigh((cov + cov.T) / 2)
        return vectors * np.sqrt(np.maximum(values, 1e-12))
