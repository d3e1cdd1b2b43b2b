"""What a NAPSU-MQ fit will cost, from public information only, before the release charges.

The size of the model is known before any data is read: the required cliques
fix a base, and MST selection adds pairs (at most the heaviest spanning forest)
only while the model stays within the largest size whose estimate fits every
limit (``max_parameters``, ``max_memory_mb``, ``max_minutes``; :mod:`.mst`). A
base that does not fit is refused. Memory and time follow from the number of
parameters D and of clique cells C:

- memory: a few D x D matrices (the likelihood's covariance, its Cholesky
  factor and inverse, the Hessian, the whitening), D x C for the feature
  covariance's forward-mode pass, the kept NUTS draws;
- time: a gradient of the exact posterior costs O(D^3 + D C) (a Cholesky
  factorization of the D x D covariance and the feature covariance), a NUTS
  leapfrog step on the fixed-covariance posterior O(D^2 + C) (0.05 ms on Adult,
  D ~ 280); L-BFGS and NUTS
  run hundreds of iterations and leapfrog steps (``LBFGS_ITERATIONS``,
  ``LEAPFROG_STEPS``, typical of Adult, docs/napsu_mq.md), at ``FLOPS`` per
  second per core (measured on this project's 2-core machine).

The figures are estimates, good to a small factor (the number of leapfrog
steps depends on the posterior's geometry); the limits they are held against
are options, so an administrator who expects a long fit can raise them.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dpsql.errors import ConfigurationError
from dpsql.synth.napsu_mq import laplace
from dpsql.synth.napsu_mq.structure import Structure
from dpsql.synth.spanning import spanning_forest

FLOPS = 2e9  # effective floating-point operations per second per core
LBFGS_ITERATIONS = 400
LEAPFROG_STEPS = 750  # per iteration, all moves together (Adult: 587-863)
BYTES = 8


@dataclass(frozen=True)
class Estimate:
    """The largest model a fit can build, and its memory and time."""

    parameters: int
    cells: int
    memory_mb: float
    minutes: float

    def describe(self) -> dict[str, float]:
        """JSON-able figures (public: they depend on the domain and options only)."""
        return {"parameters": self.parameters, "cells": self.cells,
                "memory_mb": round(self.memory_mb, 1), "minutes": round(self.minutes, 2)}


def pair_parameters(sizes: dict[str, int], a: str, b: str) -> int:
    """Canonical parameters a pair adds to a model holding both 1-way marginals."""
    return (sizes[a] - 1) * (sizes[b] - 1)


def heaviest_forest(sizes: dict[str, int], required: Sequence[Sequence[str]]) -> int:
    """Parameters of the heaviest spanning forest of pairs joining ``required``'s components."""
    pairs = sorted(itertools.combinations(sizes, 2), key=lambda p: -pair_parameters(sizes, *p))
    return sum(pair_parameters(sizes, a, b)
               for a, b in spanning_forest(sizes, pairs, joined=required))


def base_structure(names: Sequence[str], shape: Sequence[int],
                   cliques: Sequence[Sequence[str]]) -> Structure:
    """The model over ``cliques`` plus the 1-way marginal of every column."""
    index = {c: i for i, c in enumerate(names)}
    return Structure.build(shape, [*([index[c] for c in q] for q in cliques),
                                   *([i] for i in range(len(names)))])


def cells(structure: Structure) -> int:
    """Cells of the junction tree's clique tables."""
    return sum(math.prod(structure.tree_shape(i)) for i in range(len(structure.tree)))


def estimate(base: Structure, dim: int, *, nuts: bool, chains: int, iterations: int,
             jumps: int, keep: int, workers: int) -> Estimate:
    """Memory and time of a fit whose model is ``base`` grown by pairs to ``dim`` parameters.

    Each added pair of k_a x k_b cells adds (k_a - 1)(k_b - 1) parameters, and
    k_a k_b <= 4 (k_a - 1)(k_b - 1), so the cells are bounded too.
    """
    table_cells = cells(base) + 4 * (dim - base.dim)
    d = dim + 1
    gradient = 4 * d**3 + 6 * dim * table_cells
    hessian = d * gradient if d <= laplace.EXACT_HESSIAN_MAX_DIM else d**3
    flops: float = LBFGS_ITERATIONS * gradient + 5 * d**3 + hessian
    memory = 16 * d * d + 4 * dim * table_cells
    if nuts:
        step = 1.5 * d * d + 10 * table_cells
        per_iteration = (LEAPFROG_STEPS + jumps) * step + d**3 / 3
        cores = workers or os.cpu_count() or 1
        flops += chains * iterations * per_iteration / min(chains, cores)
        memory += chains * iterations * d + keep * d
    minutes = flops / FLOPS / 60
    mb = (memory * BYTES + min(laplace.HESSIAN_BATCH_BYTES, 4 * BYTES * d**3)) / 2**20
    return Estimate(dim, table_cells, mb, minutes)


def largest_fitting(base: Structure, extra: int, limits: Limits, **run: Any) -> Estimate:
    """The largest model (``base`` plus up to ``extra`` parameters) within ``limits``.

    Selection grows the model only up to its ``parameters``; when even ``base``
    exceeds a limit the fit is refused (before any charge), naming the option.
    """
    smallest = estimate(base, base.dim, **run)
    limits.refuse_beyond(smallest)
    low, high = base.dim, base.dim + extra  # low always fits; bisect the largest that does
    while low < high:
        mid = (low + high + 1) // 2
        if limits.allow(estimate(base, mid, **run)):
            low = mid
        else:
            high = mid - 1
    return estimate(base, low, **run)


@dataclass(frozen=True)
class Limits:
    """What an administrator allows one fit: the options of the same names."""

    max_parameters: int
    max_memory_mb: float
    max_minutes: float

    def allow(self, found: Estimate) -> bool:
        """Whether ``found`` is within every limit."""
        return (found.parameters <= self.max_parameters
                and found.memory_mb <= self.max_memory_mb
                and found.minutes <= self.max_minutes)

    def refuse_beyond(self, found: Estimate) -> None:
        """Raise ConfigurationError naming the option to raise when ``found`` exceeds it."""
        checks = [(f"{found.parameters:,} parameters", found.parameters, self.max_parameters,
                   "max_parameters"),
                  (f"{found.memory_mb:,.0f} MB of memory", found.memory_mb,
                   self.max_memory_mb, "max_memory_mb"),
                  (f"{found.minutes:,.1f} minutes", found.minutes, self.max_minutes,
                   "max_minutes")]
        for what, value, limit, option in checks:
            if value > limit:
                raise ConfigurationError(
                    f"napsu_mq: even the smallest model these cliques allow needs an estimated "
                    f"{what} (limit {limit:,g}, option {option}); raise it with --option "
                    f"{option}=..., or choose fewer or coarser columns, smaller cliques or "
                    "a lighter inference (inference=laplace, fewer samples); nothing was "
                    "charged")
