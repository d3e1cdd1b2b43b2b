"""The MODP prediction function: parallel non-self-predicting blades (Press 2024, sec. 3-4).

A blade is the paper's ``NonSelfPredictingLayer``: an affine map of the one-hot
row whose diagonal blocks are zero, so no column predicts itself, followed by a
sigmoid. The zeros come from a fixed mask applied in the forward pass (the
masked entries never reach an output, so their gradient is exactly zero and no
hook is needed). ``k`` blades are mixed per row by softmax weights from a small
``WeightCalculator`` (Linear -> ReLU -> Linear).

Departure from the paper: the paper's weights see every input column, so a
column's own value can reach its prediction through the weights. Here the
weights used for column ``J`` are computed from the row with column ``J``
removed (the first layer is linear, so that is its full pre-activation minus
column ``J``'s table row), which makes the whole model exactly minus-one at the
cost of ``Q`` tiny weight vectors per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dpsql.synth.modp.blocks import Blocks


@dataclass
class Forward:
    """A forward pass with the intermediate tensors DP-SGD needs for per-example norms."""

    output: torch.Tensor  # rows x width, in (0, 1)
    logits: torch.Tensor  # rows x k x width: blade pre-activations
    hidden: torch.Tensor | None  # rows x Q x r: weight-calculator pre-ReLU, column J removed
    scores: torch.Tensor | None  # rows x Q x k: weight-calculator pre-softmax
    weights: torch.Tensor | None  # rows x Q x k: the blade weights per column


class MultiBladeModel(nn.Module):
    """``blades`` non-self-predicting blades mixed by minus-one softmax weights.

    Inputs are global category indices (``rows x Q``, see :class:`Blocks`);
    ``blades=1`` is the paper's one-layer model (no weight calculator).
    """

    mask: torch.Tensor  # width x width, False on the self-predicting blocks
    block_of: torch.Tensor  # width: each category's column
    indicator: torch.Tensor  # width x Q: 1 where a category belongs to a column
    fc1: nn.Parameter  # width x r (blades > 1)
    fc1_bias: nn.Parameter
    fc2: nn.Linear

    def __init__(self, blocks: Blocks, blades: int = 5, reduced_features: int = 15,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        width = blocks.width
        self.blocks = blocks
        self.num_blades = blades
        self.weight = nn.Parameter(torch.empty(blades, width, width))  # [blade, input, output]
        self.bias = nn.Parameter(torch.empty(blades, width))
        self.register_buffer("mask", ~blocks.same_block(), persistent=False)
        self.register_buffer("block_of", blocks.block_of().clone(), persistent=False)
        self.register_buffer("indicator", blocks.indicator().clone(), persistent=False)
        if blades > 1:
            self.fc1 = nn.Parameter(torch.empty(width, reduced_features))
            self.fc1_bias = nn.Parameter(torch.empty(reduced_features))
            self.fc2 = nn.Linear(reduced_features, blades)
        self.reset_parameters(generator)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """The paper's initialization: Xavier-uniform weights, uniform(+-1/sqrt(width)) bias.

        Random only through ``generator`` (never torch's global generator when given).
        """
        width = self.blocks.width
        with torch.no_grad():
            for blade in self.weight:
                nn.init.xavier_uniform_(blade, generator=generator)
            bound = 1 / width**0.5
            nn.init.uniform_(self.bias, -bound, bound, generator=generator)
            if self.num_blades > 1:
                nn.init.xavier_uniform_(self.fc1, generator=generator)
                nn.init.zeros_(self.fc1_bias)
                reduced = self.fc2.in_features
                nn.init.uniform_(self.fc2.weight, -(reduced**-0.5), reduced**-0.5,
                                 generator=generator)
                nn.init.uniform_(self.fc2.bias, -(reduced**-0.5), reduced**-0.5,
                                 generator=generator)

    def start_from_marginals(self, probabilities: torch.Tensor, scale: float = 0.0) -> None:
        """Set every blade to the independent model of per-category ``probabilities``.

        Biases go to their logits; weights are scaled by ``scale`` (0: zero).
        """
        p = probabilities.clamp(1e-4, 1 - 1e-4).to(self.bias)
        with torch.no_grad():
            self.bias.copy_(torch.logit(p).expand_as(self.bias))
            self.weight.mul_(scale)

    def masked_weight(self) -> torch.Tensor:
        """The blades' weights with the self-predicting blocks held at zero."""
        return self.weight * self.mask

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        """Predicted probabilities (``rows x width``, not normalized per block)."""
        return self.run(index).output

    def run(self, index: torch.Tensor) -> Forward:
        """The forward pass, keeping the intermediates."""
        blades, width = self.num_blades, self.blocks.width
        table = self.masked_weight().permute(1, 0, 2).reshape(width, blades * width)
        table = F.pad(table, (0, 0, 0, 1))  # the padding index contributes nothing
        logits = F.embedding_bag(index, table, mode="sum").view(-1, blades, width) + self.bias
        probs = torch.sigmoid(logits)
        if blades == 1:
            return Forward(probs[:, 0, :], logits, None, None, None)
        fc1 = F.pad(self.fc1, (0, 0, 0, 1))
        own = F.embedding(index, fc1)  # rows x Q x r: each column's own contribution
        hidden = _sum_of_others(own) + self.fc1_bias
        scores = self.fc2(torch.relu(hidden))
        weights = torch.softmax(scores, dim=-1)  # rows x Q x k
        mixing = weights.transpose(1, 2).reshape(-1, len(self.blocks))
        per_column = (mixing @ self.indicator.T).view(-1, blades, width)  # a 2-D matmul
        output = (probs * per_column).sum(dim=1)  # elementwise: einsum here would be a bmm
        return Forward(output, logits, hidden, scores, weights)

    def parameter_count(self) -> int:
        """Trainable numbers that can affect the output (masked entries excluded)."""
        free = int(self.mask.sum()) * self.num_blades
        return free + sum(p.numel() for n, p in self.named_parameters() if n != "weight")


def parameter_count(blocks: Blocks, blades: int, reduced_features: int) -> int:
    """:meth:`MultiBladeModel.parameter_count` by arithmetic, without building the model.

    The DP-SGD forecast counts the coordinates it will noise before any charge; a
    model near the size limit would allocate hundreds of MB just to be counted.
    """
    width = blocks.width
    free = (width * width - sum(size * size for size in blocks.sizes)) * blades
    count = free + blades * width  # the masked weights and the biases
    if blades > 1:  # fc1 (width x r) and its bias, fc2 (r -> blades) and its bias
        count += width * reduced_features + reduced_features + reduced_features * blades + blades
    return count


def _sum_of_others(parts: torch.Tensor) -> torch.Tensor:
    """For each ``J`` along dim 1, the sum of all parts but ``J``.

    Exclusive prefix plus suffix sums never touch part ``J``, so the result is
    bit-for-bit independent of it.
    """
    zero = torch.zeros_like(parts[:, :1])
    before = torch.cat([zero, parts[:, :-1].cumsum(dim=1)], dim=1)
    after = torch.cat([parts.flip(1)[:, :-1].cumsum(dim=1).flip(1), zero], dim=1)
    return before + after
