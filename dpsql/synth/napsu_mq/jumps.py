"""Jumps for NUTS along cell directions whose cell may be empty (a tuning that keeps it exact).

A cell whose noisy count is a few noise sds above zero has a log-potential
with a narrow bulk and a long tail towards the prior: NUTS's steps, sized for
the bulk, cross to the tail only rarely. Independence proposals along the
cell's direction, mixed from pilot draws and the prior, cross it in one step;
a Metropolis-Hastings correction keeps the posterior exact
(:mod:`dpsql.synth.napsu_mq.nuts`).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dpsql.synth.napsu_mq.evidence import Reduced
from dpsql.synth.napsu_mq.structure import Structure


class Jumps(NamedTuple):
    """Independence proposals along cell directions with a heavy tail (see :func:`proposals`).

    Per direction d (rows of ``projection`` are d / |d|^2, so the coordinate
    s = projection @ phi grows by 1 per step d): the probability of being
    picked (0: never), and a normal mixture for s with ``COMPONENTS``
    components (a narrow bulk and a wide tail fitted to pilot draws, and the
    prior of s given the rest of phi), as weights, means and sds of shape
    (directions, components). Column j of ``move`` is the change of the
    whitened ``u`` for one step along direction j.
    """

    pick: jax.Array
    weight: jax.Array
    mean: jax.Array
    sd: jax.Array
    projection: jax.Array
    move: jax.Array


#: Mixture components of a jump proposal: bulk, tail (pilot fits) and the conditional prior.
COMPONENTS = 3


#: A pilot draw further than this many MADs from the parameter's median is in its tail.
TAIL_MADS = 6.0
#: Parameters with fewer pilot draws than this share in the tail get no jumps.
TAIL_SHARE = 0.002
#: Cells whose noisy count is below this many noise sds may be empty: their directions get
#: jumps whatever the pilot saw (see :func:`proposals`).
BORDER_SDS = 8.0
#: Below this many noise sds a cell is as likely empty as not: one prior-dominated mode, no
#: wall to cross, so its direction is picked with the smaller weight ``EMPTY_PICK``.
EMPTY_SDS = 2.0
EMPTY_PICK = 0.25
#: Weight of the conditional prior in every jump proposal.
PRIOR_WEIGHT = 0.3


def _cell_rows(structure: Structure) -> tuple[np.ndarray, np.ndarray]:
    """Per cell of every scope (with repeats): its direction, and its constant term.

    The indicator of a cell x_S = c is a linear combination of canonical
    features: prod_{j: c_j > 0} [x_j = c_j] prod_{j: c_j = 0} (1 - sum_{v>0} [x_j = v]),
    expanded over the subsets U of the reference (c_j = 0) columns with sign
    (-1)^|U|: [x_S = c] = constant + d . b(x), the constant 1 for the cell of
    reference values only (the empty product), else 0.
    """
    rows, constants = [], []
    for scope in structure.offsets:
        for cell in itertools.product(*(range(structure.sizes[j]) for j in scope)):
            value = dict(zip(scope, cell, strict=True))
            fixed = [j for j in scope if value[j]]
            reference = [j for j in scope if not value[j]]
            d = np.zeros(structure.dim)
            for r in range(len(reference) + 1):
                for free in itertools.combinations(reference, r):
                    sub = tuple(sorted([*fixed, *free]))
                    if not sub:
                        continue
                    shape = tuple(structure.sizes[j] - 1 for j in sub)
                    for values in itertools.product(*(range(1, structure.sizes[j])
                                                      for j in free)):
                        assign = {**{j: value[j] for j in fixed}, **dict(zip(free, values,
                                                                             strict=True))}
                        index = np.ravel_multi_index(tuple(assign[j] - 1 for j in sub), shape)
                        d[structure.offsets[sub] + index] += (-1) ** r
            rows.append(d)
            constants.append(0.0 if fixed else 1.0)
    return np.array(rows).reshape(-1, structure.dim), np.array(constants)


def cell_directions(structure: Structure) -> np.ndarray:
    """One direction in theta per cell of every scope: moving along it scales that cell only.

    With [x_S = c] = constant + d . b(x) (:func:`_cell_rows`), theta + t d adds
    t to the log-potential of exactly the records in that cell (the constant
    term only renormalizes). Rows without duplicates.
    """
    return np.unique(_cell_rows(structure)[0], axis=0)


def cell_signal(structure: Structure, reduced: Reduced) -> np.ndarray:
    """Per cell direction (rows of :func:`cell_directions`): noisy count / noise sd of its cell.

    The count of a cell is [constant, d] . [n, sum b], so the reduced evidence
    z estimates it with noise variance [constant, d] V [constant, d]^T (V the
    evidence's noise covariance). A direction shared by several cells takes
    the smallest ratio. Post-processing of the DP release only.
    """
    rows, constants = _cell_rows(structure)
    unique, inverse = np.unique(rows, axis=0, return_inverse=True)
    a = np.column_stack([constants, rows])
    size = a.shape[1]
    counts = a @ reduced.z[:size]
    sds = np.sqrt(np.einsum("ij,jk,ik->i", a, reduced.noise_cov[:size, :size], a))
    ratio = np.full(unique.shape[0], np.inf)
    np.minimum.at(ratio, np.ravel(inverse), counts / sds)
    return ratio


def proposals(phi: np.ndarray, chol: np.ndarray, structure: Structure,
           signal: np.ndarray | None = None, prior_sd: float = 10.0) -> tuple[Jumps, int]:
    """Jump proposals along cell directions whose cell may be empty.

    A cell whose noisy count is a few noise sds above zero has a log-potential
    with a narrow bulk (the cell is there) and a long tail towards the prior
    (it is empty): NUTS's steps, sized for the bulk and the likelihood wall
    between the two, cross from one to the other only rarely. When the cell
    holds a reference value the tail is a ridge over several parameters (a
    rare category's own logit against its interactions); the cell direction
    follows it. Picked: directions whose pilot draws have a heavy tail (more
    than ``TAIL_SHARE`` of them beyond ``TAIL_MADS`` robust sds of the median),
    and, given the cells' ``signal`` (:func:`cell_signal`), every direction
    whose noisy count is below ``BORDER_SDS`` noise sds, since a tail with a
    mass of a few per mille is often missed by a short pilot (it was on Adult).
    A cell below ``EMPTY_SDS`` sds has a single prior-dominated mode (no wall
    to cross; jumps only speed NUTS's walk across it) and is picked
    ``EMPTY_PICK`` times as often as the others.
    Each picked direction gets a normal mixture for its coordinate s: the
    bulk (pilot draws within ``TAIL_MADS`` robust sds of the median: mean and
    sd), the tail (the rest: mean and a 1.5x widened sd) when the pilot saw
    one, and with weight ``PRIOR_WEIGHT`` the prior of s given the rest of phi,
    N(0, prior_sd^2 / |d|^2) (theta = theta_perp + s d with theta_perp
    orthogonal to d): where a cell is empty the likelihood is flat and the
    posterior along d is the prior. Only tuning: any proposal leaves the
    target exact.
    """
    flat = phi.reshape(-1, phi.shape[-1])
    size = phi.shape[-1]
    directions = np.zeros((0, size))
    if structure.dim:
        cells = cell_directions(structure)
        directions = np.zeros((cells.shape[0], size))
        directions[:, :structure.dim] = cells
    norms = np.sum(directions**2, axis=1, keepdims=True)
    projection = directions / norms
    coordinates = flat @ projection.T
    count = directions.shape[0]
    border = np.zeros(count, bool) if signal is None else np.asarray(signal) < BORDER_SDS
    pick = np.zeros(count)
    weight = np.tile([1.0 - PRIOR_WEIGHT, 0.0, PRIOR_WEIGHT], (count, 1))
    mean, sd = np.zeros((count, COMPONENTS)), np.ones((count, COMPONENTS))
    mean[:, 2], sd[:, 2] = 0.0, prior_sd / np.sqrt(norms[:, 0])
    for i in range(count):
        x = coordinates[:, i]
        median = np.median(x)
        spread = 1.4826 * np.median(np.abs(x - median))
        tail = np.abs(x - median) > TAIL_MADS * max(spread, 1e-6)
        seen = tail.mean() >= TAIL_SHARE and tail.sum() >= 5
        if not (seen or border[i]):
            continue
        pick[i] = 1.0 if seen or signal is None or signal[i] >= EMPTY_SDS else EMPTY_PICK
        mean[i, 0], sd[i, 0] = x[~tail].mean(), max(x[~tail].std(), 1e-3)
        if seen:
            bulk = np.clip(1 - tail.mean(), 0.5, 0.95)
            weight[i] = (1 - PRIOR_WEIGHT) * np.array([bulk, 1 - bulk, 0.0]) + [0, 0, PRIOR_WEIGHT]
            mean[i, 1] = x[tail].mean()
            sd[i, 1] = max(1.5 * x[tail].std(), 3 * sd[i, 0])
    picked = int(np.count_nonzero(pick))
    if picked:
        pick /= pick.sum()
    else:
        pick[:] = 1.0 / max(count, 1)
    move = np.linalg.solve(chol, directions.T)
    with jax.enable_x64(True):
        arrays = [jnp.asarray(a) for a in (pick, weight, mean, sd, projection, move)]
    return Jumps(*arrays), picked


def no_jumps(size: int) -> Jumps:
    """Placeholder proposals (never used: the runner is compiled without jumps)."""
    with jax.enable_x64(True):
        ones = jnp.ones((size, COMPONENTS)) / COMPONENTS
        return Jumps(jnp.ones(size) / size, ones, ones, ones, jnp.eye(size), jnp.eye(size))
