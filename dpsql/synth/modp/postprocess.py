"""The paper's empirical-mode refinements: structural zeros and the two-instance choice.

Structural zeros follow sec. 4.2, the two-instance choice sec. 4.4. Both read
the true crosstab, so neither is DP.
"""

from __future__ import annotations

import numpy as np
import torch

from dpsql.synth.modp.blocks import Blocks


def crosstab(index: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """``width x width`` counts of category pairs over the rows (``one_hot.T @ one_hot``)."""
    dense = blocks.one_hot(index, dtype=torch.float64)
    return dense.T @ dense


def pair_sums(index: torch.Tensor, table: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """Per row, the sum of ``table[a, b]`` over its pairs of categories in different columns.

    ``table`` is ``width x width``; padding (outside-domain) cells add nothing.
    """
    padded = torch.nn.functional.pad(table, (0, 1, 0, 1))
    upper = torch.triu(torch.ones(len(blocks), len(blocks), dtype=torch.bool,
                                  device=index.device), diagonal=1)
    out = [(padded[rows[:, :, None], rows[:, None, :]] * upper).sum(dim=(1, 2))
           for rows in index.split(8192)]  # rows x Q x Q per chunk
    return torch.cat(out) if out else torch.zeros(0, dtype=table.dtype, device=table.device)


MIN_EXPECTED = 5.0  # an empty cell is structural when independence expects this many rows


def impossible_cells(true_crosstab: torch.Tensor, blocks: Blocks,
                     min_expected: float = MIN_EXPECTED) -> torch.Tensor:
    """The data's structural zeros: empty cells that independence would fill.

    A cell of two columns is impossible when no true row fills it although
    independent columns would put at least ``min_expected`` rows there. The
    expectation separates impossible combinations (a married four-year-old)
    from cells that are empty by chance, which a sparse table has by the
    thousand and which would otherwise forbid most plausible rows.
    """
    counts = torch.diagonal(true_crosstab)
    rows = counts[: blocks.sizes[0]].sum().clamp_min(1)
    expected = counts[:, None] * counts[None, :] / rows
    return (true_crosstab == 0) & (expected >= min_expected) \
        & ~blocks.same_block(true_crosstab.device)


def violates(index: torch.Tensor, impossible: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """Rows that fill at least one impossible cell."""
    return pair_sums(index, impossible.to(torch.float64), blocks) > 0


def overfill_weights(first_instance: torch.Tensor, true_crosstab: torch.Tensor,
                     blocks: Blocks) -> torch.Tensor:
    """Per cell, how much a first synthetic instance over-fills it.

    max(0, log((C_syn + 1) / (C_true + 1))): large for the crosstab cells the
    synthesis gets most wrong upwards.
    """
    synthetic = crosstab(first_instance, blocks)
    weights = torch.log((synthetic + 1) / (true_crosstab + 1)).clamp_min(0)
    return weights.masked_fill(blocks.same_block(weights.device), 0.0)


def choose_instances(first: torch.Tensor, second: torch.Tensor, weights: torch.Tensor,
                     threshold: float, blocks: Blocks) -> tuple[torch.Tensor, float]:
    """Keep each row's first instance unless its row-wise crosstab loss is too large.

    The loss is the sum of ``weights`` over the row's cells; above ``threshold``
    the row takes its second instance (unchecked, as in the paper). Returns the
    rows and the fraction switched.
    """
    switch = pair_sums(first, weights, blocks) > threshold
    chosen = torch.where(switch[:, None], second, first)
    return chosen, float(switch.double().mean()) if len(switch) else 0.0


def uniform_choice(rng: np.random.Generator, population: int, n: int) -> np.ndarray:
    """Source rows for ``n`` synthetic rows.

    Each row once per full pass, the remainder a random subset, so ``n = N``
    maps every true row to one synthetic row.
    """
    if population == 0:
        return np.zeros(0, dtype=np.int64)
    full, rest = divmod(n, population)
    parts = [rng.permutation(population) for _ in range(full)]
    parts.append(rng.choice(population, size=rest, replace=False))
    return np.concatenate(parts).astype(np.int64)
