"""Empirical-mode training (paper sec. 4.1): MSE warm-up, then the z-value loss.

Adam on shuffled mini-batches; after the warm-up, training stops early when the
epoch's mean z-loss has not improved by ``tolerance`` (relative) for
``patience`` epochs. Not differentially private: see ``dpsgd`` for that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dpsql.progress import Progress
from dpsql.synth.modp import device as devices
from dpsql.synth.modp.blocks import Blocks
from dpsql.synth.modp.losses import mse, zval_loss
from dpsql.synth.modp.model import MultiBladeModel


@dataclass(frozen=True)
class Schedule:
    """How long and how fast to train."""

    warmup_epochs: int = 3
    epochs: int = 40
    batch_size: int = 1024
    lr: float = 0.01
    patience: int = 3
    tolerance: float = 0.005


@dataclass
class History:
    """Per-epoch mean losses (JSON-able)."""

    mse: list[float] = field(default_factory=list)
    zval: list[float] = field(default_factory=list)
    stopped_early: bool = False

    def as_dict(self) -> dict[str, object]:
        """JSON-able form, losses rounded."""
        return {"mse": [round(x, 6) for x in self.mse], "zval": [round(x, 6) for x in self.zval],
                "epochs": len(self.mse) + len(self.zval), "stopped_early": self.stopped_early}


def train_empirical(model: MultiBladeModel, index: torch.Tensor, schedule: Schedule,
                    generator: torch.Generator, progress: Progress) -> History:
    """Fit ``model`` to the rows ``index`` (global category indices, on the model's device)."""
    blocks: Blocks = model.blocks
    device = index.device
    optimizer = torch.optim.Adam(model.parameters(), lr=schedule.lr)
    history = History()
    best, stale = float("inf"), 0
    total = schedule.epochs
    for epoch in range(schedule.epochs):
        warm = epoch < schedule.warmup_epochs
        order = torch.randperm(index.shape[0], generator=generator, device=device)
        losses = []
        for batch in order.split(schedule.batch_size):
            rows = index[batch]
            target = blocks.one_hot(rows)
            with devices.autocast(device):
                output = model(rows)
            loss = mse(output.float(), target) if warm else zval_loss(output, target, blocks)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        mean = sum(losses) / len(losses)
        (history.mse if warm else history.zval).append(mean)
        kind = "mse" if warm else "z-loss"
        progress(f"modp: training ({kind} {mean:.4g})", epoch + 1, total)
        if warm:
            continue
        if mean < best * (1 - schedule.tolerance):
            best, stale = mean, 0
        else:
            stale += 1
            if stale >= schedule.patience:
                history.stopped_early = True
                progress("modp: training (stopped early)", total, total)
                break
    return history
