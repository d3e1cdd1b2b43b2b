"""MODP's training losses: row-wise mean square error and the crosstab z-value loss.

``mse`` is the paper's warm-up loss (``torch.nn.MSELoss`` between the predicted
probabilities and the one-hot row); it is a sum over rows, so DP-SGD can clip
it per example. ``zval_loss`` is the paper's eq. (10) loss on crosstabs of a
whole batch; it is not a per-example sum, so only the empirical mode uses it.
"""

from __future__ import annotations

import torch

from dpsql.synth.modp.blocks import Blocks

PSEUDOCOUNT = 0.01  # the paper's fractional pseudocount on every crosstab cell
FLOOR_COUNT = 0.05  # variance floor: the variance of a cell with this many rows in the batch


def per_example_mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Squared error summed over categories, one value per row."""
    return ((output - target) ** 2).sum(dim=1)


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The paper's warm-up loss: mean squared error over all rows and categories."""
    return torch.mean((output - target) ** 2)


def normalize_blocks(output: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """Per row, each block's probabilities divided by their sum (``instantiate``'s draws)."""
    indicator = blocks.indicator(output.device).to(output.dtype)
    return output / ((output @ indicator) @ indicator.T)


def zval_loss(output: torch.Tensor, target: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """Mean squared two-proportion z-value over all crosstab cells (paper eq. 10).

    ``output`` is normalized per block first, so ``output.T @ output`` is exactly
    the expected crosstab of rows drawn by ``instantiate`` (the paper's code uses
    the raw sigmoid outputs). Cells inside one column's block are zeroed; the mean
    runs over all ``width^2`` cells, as in the paper's code.

    The variance floor is the variance of a cell holding ``FLOOR_COUNT`` rows of
    the batch (1e-7 at 1024 rows). The paper's absolute 1e-5 is the variance of
    a cell with about 20 rows of a 2048-row batch: every rarer cell falls back to
    plain squared error and hardly moves the loss, so on a sparse table (ACS
    excerpt: 27k rows, 452 categories) the small cells were left untrained.
    """
    probs = normalize_blocks(output.float(), blocks)
    target = target.float()
    cross_output = probs.T @ probs + PSEUDOCOUNT
    cross_target = target.T @ target + PSEUDOCOUNT
    n_t, n_o = target.shape[0], probs.shape[0]
    p_t = cross_target / n_t
    p_o = cross_output / n_o
    pooled = (cross_target + cross_output) / (n_t + n_o)
    variance = pooled * (1 - pooled) * (1 / n_t + 1 / n_o)
    floor = FLOOR_COUNT / ((n_t + n_o) / 2) * (1 / n_t + 1 / n_o)
    zsq = (p_t - p_o) ** 2 / (variance + floor)
    zsq = zsq.masked_fill(blocks.same_block(output.device), 0.0)
    return zsq.mean()
