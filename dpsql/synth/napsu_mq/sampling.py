"""Forward sampling of records from P_theta on the junction tree (vectorized numpy).

Roots are drawn from their clique marginal; every other clique draws its new
columns from P(x_C | x_separator) = P_C / P_S given the separator values already
drawn. One inverse-CDF lookup per clique serves all records at once: each
separator row's conditional CDF is shifted by its row number, so a single
``searchsorted`` of ``row + u`` finds every record's cell. This is
post-processing of DP parameters; its randomness is the caller's generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpsql.synth.napsu_mq.structure import Structure


def sample_records(structure: Structure, marginals: Sequence[np.ndarray], n: int,
                   rng: np.random.Generator) -> np.ndarray:
    """``n`` records as an int64 array (n, columns) of codes."""
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
        cdf = np.cumsum(cond, axis=1)
        cdf[:, -1] = 1.0
        if separator:
            row = np.ravel_multi_index(tuple(out[:, j] for j in separator),
                                       tuple(structure.sizes[j] for j in separator))
        else:
            row = np.zeros(n, dtype=np.int64)
        shifted = (cdf + np.arange(rows)[:, None]).reshape(-1)
        u = rng.random(n)
        cell = np.searchsorted(shifted, row + u, side="right") - row * table.shape[1]
        cell = np.clip(cell, 0, table.shape[1] - 1)
        values = np.unravel_index(cell, tuple(structure.sizes[j] for j in fresh))
        for j, v in zip(fresh, values, strict=True):
            out[:, j] = v
    return out
