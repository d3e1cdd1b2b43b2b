"""What a failed DP-MODP fit looks like: the check that keeps its release unpublished.

DP mode draws its rows from the DP seed marginals and then lets the model
redraw every column a few times. A model that DP-SGD's noise has pulled
askew drifts away from those marginals, to the point of a collapse (most rows
in a few cells). The check draws ``rows`` rows as a release would and compares
each column's share of values with the seeds' (total variation). It reads only
DP outputs (the seed marginals, the trained model) and draws from the model:
post-processing, as the rows released are.

A column passes when its distance stays within what the seeds' noise and the
draw explain, times :data:`NOISE_TV_FACTOR`, or within :data:`FAIL_TV` whatever
the noise (the same bounds as NAPSU-MQ's check of its measurements).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsql.synth.base import diagnostic
from dpsql.synth.forecast import expected_l1

if TYPE_CHECKING:
    from dpsql.synth.modp.fitted import FittedModp

FAIL_TV = 0.2
NOISE_TV_FACTOR = 4.0


def seed_marginals_kept(fitted: FittedModp, rows: int, rng: np.random.Generator
                        ) -> dict[str, Any]:
    """The check: ``rows`` drawn rows keep every column's seed marginal within its noise."""
    assert fitted.seeds is not None
    table = fitted.sample(rows, rng)
    probabilities = fitted.seeds.category_probabilities()
    noise = {tuple(m["columns"]): m for m in fitted.seeds.describe()["diagnostics"]["marginals"]}
    total = max(1, fitted.seeds.rows)
    worst: tuple[float, float, str] = (0.0, FAIL_TV, "")
    failed = False
    start = 0
    for name, size in zip(fitted.blocks.names, fitted.blocks.sizes, strict=True):
        seed = probabilities[start:start + size]
        start += size
        drawn = np.bincount(table.column(name).to_numpy(), minlength=size)[:size] / max(rows, 1)
        distance = 0.5 * float(np.abs(drawn - seed).sum())
        measured = noise[(name,)]
        explained = (expected_l1(measured["noise_sd"], "gaussian", size)
                     / (2 * total)
                     + 0.5 * float(np.sqrt(seed * (1 - seed) / max(rows, 1)).sum())
                     * math.sqrt(2 / math.pi))
        limit = max(FAIL_TV, NOISE_TV_FACTOR * explained)
        if distance > limit:
            failed = True
        if distance / limit >= worst[0] / worst[1]:
            worst = (distance, limit, name)
    distance, limit, column = worst
    return diagnostic(
        "sample keeps the seed marginals", not failed, round(distance, 4), round(limit, 4),
        f"the rows the model draws keep each column's DP seed marginal (total variation; "
        f"worst: {column or 'none'}); a model DP-SGD's noise pulled askew drifts or collapses")
