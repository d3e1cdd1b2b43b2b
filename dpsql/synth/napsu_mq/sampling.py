"""Forward sampling of records from P_theta on the junction tree (vectorized numpy).

Roots are drawn from their clique marginal; every other clique draws its new
columns from P(x_C | x_separator) = P_C / P_S given the separator values already
drawn. One inverse-CDF lookup per clique serves all records at once: each
separator row's conditional CDF is shifted by its row number, so a single
``searchsorted`` of ``row + u`` finds every record's cell. This is
post-processing of DP parameters; its randomness is the caller's generator.

``rounded=True`` allocates instead of drawing (as private-pgm generates MST's
data, but unbiased however many records are left over): the records of each
separator group get ``floor(c p)`` of each cell of their conditional, and the
remaining records go to cells picked by systematic sampling over the fractional
parts, so every count stays within one of its expectation ``c p`` and equals it
on average. A copy's marginals then carry far less sampling noise than i.i.d.
records; but Rubin's rules assume i.i.d. records (they subtract the i.i.d.
sampling variance), so rounded copies are for single-copy fidelity, not for
combining.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpsql.synth.napsu_mq.structure import Structure


def sample_records(structure: Structure, marginals: Sequence[np.ndarray], n: int,
                   rng: np.random.Generator, rounded: bool = False) -> np.ndarray:
    """``n`` records as an int64 array (n, columns) of codes (i.i.d. unless ``rounded``)."""
    out = np.full((n, len(structure.sizes)), -1, dtype=np.int64)
    for i, clique in enumerate(structure.tree):
        table = np.clip(np.asarray(marginals[i], dtype=np.float64), 0, None)
        separator = structure.separator(i)
        fresh = [j for j in clique if j not in separator]
        order = [clique.index(j) for j in separator] + [clique.index(j) for j in fresh]
        table = np.transpose(table, order)
        rows = int(np.prod([structure.sizes[j] for j in separator], dtype=np.int64))
        table = table.reshape(rows, -1)
        totals = table.sum(axis=1, keepdims=True)
        safe = np.where(totals > 0, totals, 1.0)
        cond = np.where(totals > 0, table / safe, 1.0 / table.shape[1])
        if separator:
            row = np.ravel_multi_index(tuple(out[:, j] for j in separator),
                                       tuple(structure.sizes[j] for j in separator))
        else:
            row = np.zeros(n, dtype=np.int64)
        if rounded:
            cell = _allocated(cond, row, rng)
        else:
            cdf = np.cumsum(cond, axis=1)
            cdf[:, -1] = 1.0
            shifted = (cdf + np.arange(rows)[:, None]).reshape(-1)
            u = rng.random(n)
            cell = np.searchsorted(shifted, row + u, side="right") - row * table.shape[1]
            cell = np.clip(cell, 0, table.shape[1] - 1)
        values = np.unravel_index(cell, tuple(structure.sizes[j] for j in fresh))
        for j, v in zip(fresh, values, strict=True):
            out[:, j] = v
    return out


def _allocated(cond: np.ndarray, row: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each record's cell when every group ``row`` splits by rounding ``count * cond[row]``.

    Systematic sampling over a group's fractional parts picks its leftover
    records' cells: cell k gets one with probability exactly its fractional
    part, so counts are unbiased and each is the floor or the ceiling of its
    expectation. The cells are then dealt to the group's records in random order.
    """
    groups, width = cond.shape
    counts = np.bincount(row, minlength=groups)
    expected = counts[:, None] * cond
    base = np.floor(expected)
    left = np.rint(counts - base.sum(axis=1))  # records still to place, per group
    # The fractional parts sum to ``left`` up to rounding error: make it exact.
    cumulative = np.minimum(np.cumsum(expected - base, axis=1), left[:, None])
    cumulative[:, -1] = left
    u = 1.0 - rng.random((groups,))  # in (0, 1]: the points u + j, j < left, are chosen
    edges = np.floor(cumulative + 1.0 - u[:, None])
    extra = np.diff(edges, axis=1, prepend=np.zeros((groups, 1)))
    allocation = (base + extra).astype(np.int64).reshape(-1)
    cells = np.repeat(np.tile(np.arange(width), groups), allocation)
    order = np.lexsort((rng.random(row.size), row))  # by group, randomly within it
    out = np.empty(row.size, dtype=np.int64)
    out[order] = cells
    return out
