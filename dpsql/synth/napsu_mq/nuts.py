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

Optional tuning that keeps the posterior exact (see :func:`sample`): a pilot
run whose draws whiten and start the real run, NUTS moves on the cheap
fixed-covariance posterior corrected by a Metropolis-Hastings step to the
exact one, and jumps along cell directions whose cell may be empty.
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
from dpsql.synth.napsu_mq.jumps import COMPONENTS, Jumps, cell_signal, no_jumps, proposals
from dpsql.synth.napsu_mq.laplace import Laplace, evidence_arrays
from dpsql.synth.napsu_mq.structure import Structure

CHUNK = 25  # iterations per compiled call (progress granularity)
# Chains start at the Laplace mode plus N(0, INIT_SPREAD^2) in whitened units: a full
# N(0, I) start puts prior-dominated logits of near-empty cells far beyond the
# likelihood's wall, where gradients are huge and early warmup crawls.
INIT_SPREAD = 0.1


@dataclass
class Draws:
    """Posterior draws of ``phi`` per chain, the sampler's diagnostics and its timings.

    ``timings`` are for benchmarks and never described: a release records no timings.
    """

    phi: np.ndarray  # (chains, samples, dim)
    diagnostics: dict[str, Any]
    timings: dict[str, float]


def _potential_gen(structure: Structure, covariance: str) -> Any:
    """Potential of ``u`` given (evidence, whitening mean, its Cholesky, likelihood Cholesky).

    The last argument is used only with a fixed likelihood covariance
    (``covariance`` ``"mode"``, or ``"corrected"`` for its moves).
    """
    def make(evidence: model.Evidence, mean: jax.Array, chol: jax.Array,
             likelihood_chol: jax.Array) -> Any:
        def potential(u: jax.Array) -> jax.Array:
            phi = mean + chol @ u
            if covariance in ("mode", "corrected"):
                return -model.log_posterior_plugin(structure, phi, evidence, likelihood_chol)
            return -model.log_posterior(structure, phi, evidence)
        return potential
    return make


@lru_cache(maxsize=16)
def _kernels(structure: Structure, covariance: str, moves: int, jumps: int
             ) -> tuple[Any, Any, Any, Any]:
    """(init kernel, jitted chunk runner, jitted potential value-and-grad, exact log weight).

    One iteration is ``moves`` NUTS transitions. With ``covariance="corrected"``
    the transitions move on the fixed-covariance posterior pi_s and the
    iteration ends with a Metropolis-Hastings step to the exact posterior pi:
    the end point x' is accepted with probability min(1, w(x') / w(x)), w =
    pi / pi_s. NUTS with a fixed step size and mass matrix is reversible with
    respect to pi_s (so is a power of it), hence the corrected kernel is
    reversible with respect to pi: the draws target the exact posterior (the
    surrogate transition method, Liu 2001, sec. 9.4.3). Only the value of the
    exact posterior is needed, once per iteration, not its costly gradient.

    Then ``jumps`` Metropolis-Hastings updates follow, each along one picked
    cell direction d: phi = phi_perp + s d with phi_perp orthogonal to d kept,
    and a new s drawn from the direction's fitted mixture (an independence
    proposal in s, accepted with the Hastings ratio under the chain's target;
    the change of variables is linear, so no Jacobian). They move a near-empty
    cell between its bulk and its empty tail, which NUTS crosses only rarely.
    Each update leaves the target invariant, so the composed iteration does too.
    """
    make = _potential_gen(structure, covariance)
    exact = _potential_gen(structure, "exact")
    init_kernel, sample_kernel = hmc(potential_fn_gen=make, algo="NUTS")

    def log_weight(u: jax.Array, surrogate_pe: jax.Array, *args: Any) -> jax.Array:
        """Log pi(u) - log pi_s(u) (0 when the moves already target pi)."""
        if covariance != "corrected":
            return jnp.zeros((), u.dtype)
        return surrogate_pe - exact(*args)(u)

    def log_q(jump: Jumps, i: jax.Array, x: jax.Array) -> jax.Array:
        logpdf = jax.scipy.stats.norm.logpdf(x, jump.mean[i], jump.sd[i])
        return jax.scipy.special.logsumexp(logpdf, b=jump.weight[i])

    def jump_once(args: tuple[Any, ...], jump: Jumps, carry: Any, key: jax.Array
                  ) -> tuple[Any, Any]:
        state, logw = carry
        pick_key, side_key, value_key, accept_key = jax.random.split(key, 4)
        i = jax.random.choice(pick_key, jump.pick.shape[0], p=jump.pick)
        mean, chol = args[1], args[2]
        old = jump.projection[i] @ (mean + chol @ state.z)
        part = jax.random.choice(side_key, COMPONENTS, p=jump.weight[i])
        normal = jax.random.normal(value_key, dtype=old.dtype)
        new = jump.mean[i, part] + jump.sd[i, part] * normal
        u = state.z + jump.move[:, i] * (new - old)
        pe, grad = jax.value_and_grad(make(*args))(u)
        new_logw = log_weight(u, pe, *args)
        # The chain's target potential is the moves' potential minus log w.
        log_ratio = ((state.potential_energy - logw) - (pe - new_logw)
                     + log_q(jump, i, old) - log_q(jump, i, new))
        accept = jnp.log(jax.random.uniform(accept_key)) < log_ratio
        moved = state._replace(z=u, z_grad=grad, potential_energy=pe)
        state = jax.tree.map(lambda a, b: jnp.where(accept, a, b), moved, state)
        return (state, jnp.where(accept, new_logw, logw)), accept

    def run(carry: Any, jump: Jumps, *args: Any) -> Any:
        def move(state: Any, _: Any) -> tuple[Any, Any]:
            state = sample_kernel(state, model_args=args)
            return state, (state.num_steps, state.diverging, state.accept_prob)

        def step(carry: Any, _: Any) -> tuple[Any, Any]:
            state, key, logw = carry
            proposal, (steps, div, acc) = jax.lax.scan(move, state, None, length=moves)
            key, sub, jump_key = jax.random.split(key, 3)
            new_logw = log_weight(proposal.z, proposal.potential_energy, *args)
            accept = jnp.log(jax.random.uniform(sub)) < new_logw - logw
            kept = proposal._replace(z=state.z, z_grad=state.z_grad,
                                     potential_energy=state.potential_energy)
            state = jax.tree.map(lambda a, b: jnp.where(accept, a, b), proposal, kept)
            logw = jnp.where(accept, new_logw, logw)
            jumped = jnp.zeros((), jnp.int32)
            if jumps:
                (state, logw), hits = jax.lax.scan(
                    lambda c, k: jump_once(args, jump, c, k), (state, logw),
                    jax.random.split(jump_key, jumps))
                jumped = hits.sum()
            return (state, key, logw), (state.z, steps.sum(), div.any(), acc.mean(), accept,
                                        jumped)

        return jax.lax.scan(step, carry, None, length=CHUNK)

    value_grad = jax.jit(lambda u, *args: jax.value_and_grad(make(*args))(u))
    return init_kernel, jax.jit(run), value_grad, jax.jit(log_weight)


def sample(structure: Structure, reduced: Reduced, laplace: Laplace, prior_sd: float, *,
           chains: int, warmup: int, samples: int, max_tree_depth: int, target_accept: float,
           rng: np.random.Generator, progress: Progress, workers: int = 0,
           covariance: str = "exact", pilot: tuple[int, int] = (0, 0), moves: int = 1,
           jumps: int = 0) -> Draws:
    """Run ``chains`` NUTS chains on ``workers`` threads (0: one per core), float64.

    ``covariance="mode"`` fixes the likelihood's covariance at the Laplace mode
    (an optional approximation, see :func:`model.log_likelihood_plugin`).
    ``pilot=(w, s)`` with ``s > 0`` first runs ``w`` warmup and ``s`` sampling
    iterations per chain on the cheap ``covariance="mode"`` posterior, then
    whitens the real run by the pilot draws' mean and covariance and starts its
    chains at the pilot chains' last draws (see :func:`_pilot_whitening`). The
    pilot only tunes the sampler: the target of the real run is unchanged.
    """
    started = time.perf_counter()
    workers = min(chains, workers or os.cpu_count() or 1)
    with jax.enable_x64(True):
        evidence = evidence_arrays(reduced, prior_sd)
        likelihood_chol = jnp.eye(1)
        if covariance != "exact" or pilot[1] > 0:
            likelihood_chol = _fixed_covariance(structure, laplace.mean, evidence)
    dim = laplace.mean.size
    mean, chol = laplace.mean, _cholesky(laplace.cov)
    starts = [mean + chol @ rng.normal(0.0, INIT_SPREAD, dim) for _ in range(chains)]
    pilot_diagnostics, timings = None, {}
    jump, tails = no_jumps(dim), 0
    if pilot[1] > 0:
        phi, runs = _run(structure, "mode", evidence, likelihood_chol, mean, chol, starts,
                         pilot[0], pilot[1], max_tree_depth, target_accept, rng, workers,
                         progress, "nuts pilot")
        pilot_diagnostics = _summary(phi, runs, pilot[0])
        timings = {"pilot_seconds": time.perf_counter() - started}
        mean, chol = _pilot_whitening(phi, laplace.cov)
        starts = [chain[-1] for chain in phi]
        if jumps:
            jump, tails = proposals(phi, chol, structure, cell_signal(structure, reduced),
                                 prior_sd)
        if covariance == "corrected":
            # The moves' covariance where the posterior mass is, not at the mode.
            with jax.enable_x64(True):
                likelihood_chol = _fixed_covariance(structure, mean, evidence)
    phi, runs = _run(structure, covariance, evidence, likelihood_chol, mean, chol, starts,
                     warmup, samples, max_tree_depth, target_accept, rng, workers, progress,
                     "nuts", moves, jump, jumps if tails else 0)
    diagnostics = {
        "chains": chains, "warmup": warmup, "samples": samples, "workers": workers,
        "max_tree_depth": max_tree_depth, "target_accept": target_accept,
        "covariance": covariance, "moves": moves, "jumps": jumps if tails else 0,
        "jump_directions": tails,
        "whitening": "pilot" if pilot[1] > 0 else "laplace",
        **_summary(phi, runs, warmup),
    }
    if pilot_diagnostics is not None:
        diagnostics["pilot"] = {"warmup": pilot[0], "samples": pilot[1], **pilot_diagnostics}
    timings = {"seconds": time.perf_counter() - started, **timings, **_timings(runs)}
    return Draws(phi, diagnostics, timings)


#: Shrinkage of the pilot covariance towards the Laplace covariance (weight of the latter).
PILOT_SHRINK = 0.05


def _pilot_whitening(phi: np.ndarray, laplace_cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and Cholesky factor of the pooled pilot draws (``(chains, draws, dim)``).

    Where near-empty cells leave a likelihood wall on one side and only the
    prior on the other, the posterior sits far from the Laplace mode (tens of
    Laplace sds on Adult) and is many times wider than the Laplace curvature
    says; the pilot draws measure both. A little of the Laplace covariance is
    mixed in so that a direction the short pilot barely explored keeps a scale.
    """
    flat = phi.reshape(-1, phi.shape[-1])
    cov = (1 - PILOT_SHRINK) * np.cov(flat, rowvar=False) + PILOT_SHRINK * laplace_cov
    return flat.mean(axis=0), _cholesky(cov)


def _run(structure: Structure, covariance: str, evidence: model.Evidence,
         likelihood_chol: jax.Array, mean: np.ndarray, chol: np.ndarray,
         starts: list[np.ndarray], warmup: int, samples: int, max_tree_depth: int,
         target_accept: float, rng: np.random.Generator, workers: int, progress: Progress,
         label: str, moves: int = 1, jump: Jumps | None = None, jumps: int = 0
         ) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """One NUTS run whitened by ``phi = mean + chol u``; chains start at ``starts`` (phi).

    Returns the sampling draws of ``phi`` (chains, samples, dim) and per-chain records.
    """
    init_kernel, run, value_grad, log_weight = _kernels(structure, covariance, moves, jumps)
    jump = no_jumps(mean.size) if jump is None else jump
    with jax.enable_x64(True):
        args = (evidence, jnp.asarray(mean), jnp.asarray(chol), likelihood_chol)
    chains = len(starts)
    u_starts = [np.linalg.solve(chol, start - mean) for start in starts]
    keys = [int(rng.integers(2**31)) for _ in range(chains)]
    total = warmup + samples
    chunks = -(-total // CHUNK)
    lock = threading.Lock()
    done = [0]

    def chain(i: int) -> dict[str, Any]:
        # enable_x64 is thread-local: every worker thread enters it itself.
        with jax.enable_x64(True):
            u0 = jnp.asarray(u_starts[i])
            pe, grad = value_grad(u0, *args)
            state = init_kernel(ParamInfo(u0, pe, grad), warmup * moves,
                                rng_key=jax.random.key(keys[i]),
                                model_args=args,
                                max_tree_depth=max_tree_depth,
                                target_accept_prob=target_accept)
            carry = (state, jax.random.key(keys[i] + 1), log_weight(u0, pe, *args))
            parts: list[tuple[np.ndarray, ...]] = []
            seconds: list[float] = []
            for k in range(chunks):
                t0 = time.perf_counter()
                carry, out = run(carry, jump, *args)
                parts.append(tuple(np.asarray(x) for x in out))
                seconds.append(time.perf_counter() - t0)
                with lock:
                    done[0] += min(CHUNK, total - k * CHUNK)
                    stage = done[0] / chains
                    if stage <= warmup:
                        progress(f"{label} warmup", stage, warmup)
                    else:
                        progress(f"{label} sampling", stage - warmup, samples)
            z, steps, div, acc, mh, hops = (np.concatenate(x)[:total]
                                            for x in zip(*parts, strict=True))
            return {"u": z[warmup:], "steps": steps, "divergent": div[warmup:],
                    "accept": acc[warmup:], "mh_accept": mh[warmup:],
                    "jumps": hops[warmup:],
                    "step_size": float(carry[0].adapt_state.step_size),
                    "first_chunk": seconds[0],
                    # After the first chunk (which includes compilation):
                    "steady_seconds": sum(seconds[1:]), "steady_steps": int(steps[CHUNK:].sum())}

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(chain, range(chains)))
    u = np.stack([r["u"] for r in results])
    return mean + u @ np.asarray(chol).T, results


def _summary(phi: np.ndarray, results: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Convergence and cost figures of one run."""
    chains, _, dim = phi.shape
    n_steps = np.stack([r["steps"] for r in results])
    rhat = np.asarray(split_gelman_rubin(phi)) if chains > 1 else np.full(dim, np.nan)
    ess = np.asarray(effective_sample_size(phi))
    return {
        "max_rhat": float(np.nanmax(rhat)) if chains > 1 else None,
        "min_ess": float(np.min(ess)),
        "divergences": int(sum(r["divergent"].sum() for r in results)),
        "iterations": int(sum(r["divergent"].size for r in results)),
        "mean_accept_prob": float(np.mean([r["accept"].mean() for r in results])),
        "correction_accept_rate": float(np.mean([r["mh_accept"].mean() for r in results])),
        "accepted_jumps_per_iteration": float(np.mean([r["jumps"].mean() for r in results])),
        "step_size": [r["step_size"] for r in results],
        "leapfrog_steps": {"warmup": int(n_steps[:, :warmup].sum()),
                           "sampling": int(n_steps[:, warmup:].sum()),
                           "mean_per_iteration": float(n_steps[:, warmup:].mean()),
                           "max_per_iteration": int(n_steps.max())},
    }


def _timings(results: list[dict[str, Any]]) -> dict[str, float]:
    """Wall times of one run, for benchmarks only (never in a release's record)."""
    return {
        # Wall time per leapfrog step of one chain, compilation excluded; with several
        # workers the chains share the cores, so this is not the per-core cost.
        "ms_per_leapfrog_step": 1e3 * sum(r["steady_seconds"] for r in results)
        / max(1, sum(r["steady_steps"] for r in results)),
        "compile_and_first_chunk_seconds": max(r["first_chunk"] for r in results),
    }


def _fixed_covariance(structure: Structure, phi: np.ndarray, evidence: model.Evidence
                      ) -> jax.Array:
    """Cholesky factor of the likelihood's covariance at ``phi`` (inside enable_x64)."""
    return jnp.linalg.cholesky(_likelihood_covariance(structure)(jnp.asarray(phi), evidence))


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
