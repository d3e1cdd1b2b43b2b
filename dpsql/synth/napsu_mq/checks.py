"""What a failed NAPSU-MQ fit looks like: the checks that keep its release unpublished.

Each check reads only DP outputs (the noisy marginals the fit measured, the
posterior it inferred from them), so computing it is post-processing. The
release publishes a table only when every check passes (:mod:`dpsql.release`):

- the Laplace optimizer found the posterior mode;
- the importance-sampling effective sample size of the Laplace Gaussian is at
  least :data:`FAIL_ESS`: below it, one proposal carries all the weight and every
  copy repeats the same draw (a warning already says so below ``MIN_ESS``);
- for NUTS, the chains agree (R-hat) and few transitions diverged;
- the model matches what it measured: for posterior draws, the total variation
  distance between each measured marginal (noisy counts, normalised) and the
  model's marginal on those columns stays within what the noise explains. A
  collapsed fit (most rows in one cell while the measurements are spread) fails
  here, whatever the optimizer reported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpsql.synth.base import diagnostic
from dpsql.synth.napsu_mq import posterior as post
from dpsql.synth.napsu_mq import resample
from dpsql.synth.napsu_mq.evidence import Observed
from dpsql.synth.napsu_mq.model import compiled_marginals
from dpsql.synth.napsu_mq.structure import Structure

FAIL_ESS = 2  # importance draws: fewer than two means one draw in every copy
FAIL_RHAT = 1.1  # Gelman and Rubin's original bound
FAIL_DIVERGENT = 0.05  # divergent transitions per post-warmup draw
FAIL_TV = 0.2  # total variation a measured marginal may be off by, whatever its noise
NOISE_TV_FACTOR = 4.0  # ... or this many times what its noise alone explains
FIT_DRAWS = 8  # posterior draws whose marginals are compared with the measurements


def checks(diagnostics: dict[str, Any]) -> list[dict[str, Any]]:
    """The inference checks, from the diagnostics the fit recorded (Laplace, NUTS)."""
    lap = diagnostics["laplace"]
    out = [diagnostic("laplace optimizer converged", lap["converged"], lap["iterations"],
                      None, "the posterior mode was found (L-BFGS met its tolerance)")]
    ess = lap.get("importance_ess")
    if ess is not None:
        out.append(diagnostic(
            "importance-sampling ESS", ess >= FAIL_ESS, ess, FAIL_ESS,
            f"the {resample.PROPOSALS} Gaussian draws weigh as at least {FAIL_ESS} "
            "independent posterior draws; below, every copy repeats one draw"))
    chain = diagnostics.get("nuts")
    if chain:
        rhat = chain["max_rhat"]  # None for one chain: nothing to compare
        out.append(diagnostic("NUTS max R-hat", rhat is None or rhat <= FAIL_RHAT, rhat,
                              FAIL_RHAT, "the chains agree on the posterior"))
        share = chain["divergences"] / max(1, chain["iterations"])
        out.append(diagnostic("NUTS divergent share", share <= FAIL_DIVERGENT,
                              round(share, 4), FAIL_DIVERGENT,
                              "the sampler explored the posterior without breaking down"))
    return out


def measurement_fit(structure: Structure, posterior: post.Posterior,
                    observed: Sequence[Observed]) -> dict[str, Any]:
    """The worst gap between a measured marginal and the model's, over a few posterior draws.

    The gap is the total variation distance between the noisy counts (negative
    cells at 0, normalised) and the model's marginal; its limit is the larger of
    :data:`FAIL_TV` and :data:`NOISE_TV_FACTOR` times the distance the noise alone
    makes on average (half the expected absolute noise over the cells, per row).
    Draws come from a fixed generator: a check must not move the release's seed.
    """
    rng = np.random.default_rng(0)
    compute = compiled_marginals(structure)
    worst: dict[str, Any] | None = None
    for _ in range(FIT_DRAWS):
        phi = posterior.draw(rng)
        with jax.enable_x64(True):  # as sampling computes them
            tables = [np.asarray(t) for t in compute(jnp.asarray(phi[: structure.dim]))]
        for seen in observed:
            noisy = np.clip(np.asarray(seen.noisy, dtype=float), 0, None)
            total = float(noisy.sum())
            if total <= 0:
                continue  # nothing measured above the noise: no reference to compare with
            model = _marginal(structure, tables, seen.scope)
            gap = 0.5 * float(np.abs(model - noisy / total).sum())
            noise = 0.5 * noisy.size * math.sqrt(2 * seen.variance / math.pi) / total
            limit = max(FAIL_TV, NOISE_TV_FACTOR * noise)
            if worst is None or gap - limit > worst["gap"] - worst["limit"]:
                worst = {"gap": round(gap, 4), "limit": round(limit, 4),
                         "columns": list(seen.scope)}
    return worst or {"gap": 0.0, "limit": FAIL_TV, "columns": []}


def fit_check(worst: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """:func:`measurement_fit`'s result as a check."""
    columns = "+".join(names[j] for j in worst["columns"]) or "none"
    return diagnostic(
        "model matches its measurements", worst["gap"] <= worst["limit"], worst["gap"],
        worst["limit"], f"the largest total variation distance between a measured marginal "
        f"({columns}) and the model's, over {FIT_DRAWS} posterior draws; a collapsed fit puts "
        "most rows in a few cells the measurements do not")


def _marginal(structure: Structure, tables: list[np.ndarray],
              columns: tuple[int, ...]) -> np.ndarray:
    """The model's marginal on ``columns`` (in that axis order) from a junction-tree clique."""
    for clique, table in zip(structure.tree, tables, strict=True):
        if set(columns) <= set(clique):
            keep = tuple(clique.index(c) for c in columns)
            summed = table.sum(axis=tuple(i for i in range(len(clique)) if i not in keep))
            order = sorted(keep)  # the axes left, in the clique's order
            marginal = np.transpose(summed, [order.index(k) for k in keep])
            return marginal / max(float(marginal.sum()), 1e-300)
    raise AssertionError(f"no junction-tree clique holds columns {columns}")
