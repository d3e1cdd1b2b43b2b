"""Turn predicted probabilities into synthetic rows (the paper's ``instantiate``).

Per row and per column, the block's probabilities are normalized and one
category is drawn; the entropy of the draws (bits) is returned per row, the
quantity behind the paper's plausible-deniability measure (sec. 6). Vectorized
over rows; the loop runs over columns only.
"""

from __future__ import annotations

import itertools
import math

import torch

from dpsql.synth.modp.blocks import Blocks

_TINY = 1e-30  # keeps a block drawable if every probability in it underflowed


def instantiate(probs: torch.Tensor, blocks: Blocks, generator: torch.Generator,
                passthrough: float = 0.0, true_index: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one category per column for every row of ``probs`` (``rows x width``).

    With ``passthrough = p`` (paper sec. 4.3), each cell keeps its true category
    (``true_index``) with probability p and is drawn from the model otherwise;
    the mixture is sampled in one draw and its entropy is what is reported.
    Returns global category indices (``rows x Q``) and entropies in bits (``rows``).
    """
    if passthrough and true_index is None:
        raise ValueError("passthrough needs the true rows")
    probs = probs.detach().to(torch.float64).clamp_min(_TINY)
    rows = probs.shape[0]
    index = torch.empty(rows, len(blocks), dtype=torch.long, device=probs.device)
    entropy = torch.zeros(rows, dtype=torch.float64, device=probs.device)
    starts = blocks.starts
    for column, (start, end) in enumerate(itertools.pairwise(starts)):
        q = probs[:, start:end]
        q = q / q.sum(dim=1, keepdim=True)
        if passthrough:
            assert true_index is not None
            own = true_index[:, column]
            valid = own != blocks.pad
            keep = torch.zeros_like(q)
            keep[valid, (own[valid] - start)] = 1.0
            q = torch.where(valid[:, None], (1 - passthrough) * q + passthrough * keep, q)
        entropy -= torch.special.xlogy(q, q).sum(dim=1) / math.log(2)
        index[:, column] = _draw(q, generator) + start
    return index, entropy


def _draw(q: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One category per row of ``q`` by inverse CDF (3x faster than ``torch.multinomial``)."""
    cdf = q.cumsum(dim=1)
    u = torch.rand(q.shape[0], 1, generator=generator, dtype=q.dtype, device=q.device)
    draws = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1)
    return draws.clamp_max(q.shape[1] - 1)
