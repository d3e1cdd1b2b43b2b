"""DP-SGD for the MODP model: per-example clipping, exact discrete Gaussian noise.

Per-example gradient norms are computed without materializing per-example
gradients ("ghost" norms): every layer is linear in a one-hot row, so each
parameter's per-example gradient is an outer product (or a short sum of them)
whose norm follows from the backpropagated signals. The clipped sum then comes
from a second backward pass of the per-example losses weighted by their clip
factors. ``tests/synth/modp/test_dpsgd.py`` checks both against
``torch.func.vmap(grad)`` per-sample gradients.

Privacy: the unit is one privacy unit (at most ``max_rows`` rows); the loss is
a sum of per-row terms (squared error, :func:`losses.per_example_mse`), each
row's gradient is clipped to L2 norm ``clip``, so the exact clipped sum has L2
sensitivity ``max_rows * clip`` under add/remove. The sum is rounded to a
fixed-point grid of step ``g`` (``dpsql.noise.FixedPoint``), which moves each
of two neighbouring sums by at most ``g sqrt(d) / 2`` for ``d`` noised
coordinates, so the integer vector has sensitivity ``max_rows * clip / g +
ceil(sqrt(d))`` grid units; independent discrete Gaussian noise from
``dpsql.noise`` (exact sampler, no floating-point noise) of variance ``sigma2``
is added to every coordinate. Per step that is ``delta^2 / (2 sigma2)``-zCDP
(Canonne, Kamath & Steinke 2020); the steps compose through
:mod:`dpsql.synth.modp.accounting` (Abadi et al. 2016 for DP-SGD). Masked
(self-predicting) weights never affect the output and get no noise and no
update. Residual caveat, shared with every DP-SGD library: the clipped sum is
computed in floating point (float32 per chunk, float64 across chunks); its
rounding error, orders of magnitude below the grid step, is not formally
bounded. Everything after the noisy sum (Adam, sampling) is post-processing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from dpsql import noise
from dpsql.privacy import PrivacyCost
from dpsql.progress import Progress
from dpsql.synth.modp import accounting
from dpsql.synth.modp.losses import per_example_mse
from dpsql.synth.modp.model import Forward, MultiBladeModel

GRID_UNITS = 2**20  # grid steps per clip bound: rounding adds ~sqrt(d)/2**20 to the sensitivity
CHUNK = 4096  # rows per forward pass (memory), summed exactly across chunks in float64


@dataclass(frozen=True)
class DPSGDConfig:
    """The public knobs of DP-SGD."""

    steps: int = 100
    clip: float = 1.0
    sampling_rate: float = 1.0  # 1 = full batch, else Poisson subsampling of rows
    lr: float = 0.01


def per_example_sq_norms(model: MultiBladeModel, index: torch.Tensor, fwd: Forward,
                         d_logits: torch.Tensor, d_hidden: torch.Tensor | None,
                         d_scores: torch.Tensor | None) -> torch.Tensor:
    """Squared L2 norm of each row's full parameter gradient, from backpropagated signals.

    ``d_*`` are the gradients of the summed per-example losses with respect to
    the forward's intermediates, which are per-example because rows do not
    interact. Computed in float32.
    """
    blocks = model.blocks
    active = (index != blocks.pad).float()  # rows x Q: columns with a one-hot input
    d_logits = d_logits.float()
    per_blade = (d_logits**2).sum(dim=2)  # rows x k
    rows, blades, width = d_logits.shape
    per_block = ((d_logits**2).reshape(-1, width) @ blocks.indicator(index.device)
                 ).view(rows, blades, -1)  # rows x k x Q, as one 2-D matmul
    # weight row j (active, in column J) gets d_logits outside J: |d|^2 - |d_J|^2
    weight = (active.sum(dim=1, keepdim=True) * per_blade
              - torch.einsum("rq,rkq->rk", active, per_block)).sum(dim=1)
    total = weight + per_blade.sum(dim=1)  # + blade biases
    if d_hidden is None or d_scores is None:
        return total
    d_hidden, d_scores = d_hidden.float(), d_scores.float()
    assert fwd.hidden is not None
    # fc1 row j (active, in column J) feeds every column's hidden layer but J's
    summed = d_hidden.sum(dim=1)  # rows x r
    fc1 = ((summed[:, None, :] - d_hidden) ** 2).sum(dim=2)
    total = total + (active * fc1).sum(dim=1) + (summed**2).sum(dim=1)
    fc2 = torch.einsum("rqk,rqh->rkh", d_scores, torch.relu(fwd.hidden.float()))
    return total + (fc2**2).sum(dim=(1, 2)) + (d_scores.sum(dim=1) ** 2).sum(dim=1)


def clipped_gradient_sum(model: MultiBladeModel, index: torch.Tensor, clip: float
                         ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Sum over rows of each row's gradient scaled to L2 norm at most ``clip``.

    Returns the sums (float64, shaped like the parameters) and the per-row
    norms before clipping.
    """
    params = list(model.parameters())
    sums = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    norms = []
    for rows in index.split(CHUNK):
        target = model.blocks.one_hot(rows)
        # Full precision: a reduced-precision backward pass could push a clipped row's
        # gradient past ``clip``, and the sensitivity assumes it never does.
        fwd = model.run(rows)
        losses = per_example_mse(fwd.output.float(), target)
        inter = [t for t in (fwd.logits, fwd.hidden, fwd.scores) if t is not None]
        signals = torch.autograd.grad(losses.sum(), inter, retain_graph=True)
        d_hidden, d_scores = (signals[1], signals[2]) if len(signals) == 3 else (None, None)
        sq = per_example_sq_norms(model, rows, fwd, signals[0], d_hidden, d_scores)
        norm = sq.clamp_min(0).sqrt()
        factor = (clip / norm.clamp_min(1e-12)).clamp(max=1.0)
        grads = torch.autograd.grad((losses * factor.detach()).sum(), params)
        for total, grad in zip(sums, grads, strict=True):
            total += grad.double()
        norms.append(norm.detach())
    return sums, torch.cat(norms)


def noise_multiplier(steps: int, budget: PrivacyCost) -> float:
    """The noise per unit of sensitivity that ``steps`` Gaussian steps within ``budget`` need.

    ``sqrt(steps / (2 rho))``: the start of the calibration (0 for no or unbounded budget).
    """
    if budget.infinite or budget.is_zero:
        return 0.0
    return math.sqrt(steps / (2 * float(budget.value)))


def grid_units(multiplier: float, rounding: int) -> int:
    """Grid steps per sensitivity bound: ``GRID_UNITS`` unless the noise would not fit.

    Fewer (halving) while the noise in grid units, ``multiplier * (units +
    rounding)``, would pass the sampler's largest sigma.
    """
    if multiplier <= 0:
        return GRID_UNITS
    room = noise.MAX_GAUSSIAN_SIGMA / (multiplier * 1.01) - rounding
    units = GRID_UNITS
    while units > 1 and units > room:
        units //= 2
    return units


def step_sensitivity(dimension: int, clip: float, max_rows: int, multiplier: float
                     ) -> tuple[noise.FixedPoint, Fraction]:
    """The fixed-point grid of a step's summed gradient and its L2 sensitivity in grid units.

    A unit's ``max_rows`` clipped rows move the sum by at most ``max_rows * clip``;
    rounding each of the ``dimension`` coordinates to the grid adds at most
    ``ceil(sqrt(dimension))`` units. Public arithmetic: the release checks it before
    the charge (:meth:`~dpsql.synth.modp.synthesizer.Modp.check`).
    """
    rounding = math.isqrt(dimension - 1) + 1  # ceil(sqrt(d))
    grid = noise.FixedPoint.for_bound(max_rows * clip, grid_units(multiplier, rounding))
    return grid, Fraction(max_rows) * Fraction(clip) / Fraction(grid.grid) + rounding


class NoisyGradient:
    """Rounds clipped sums to the fixed-point grid and adds discrete Gaussian noise."""

    def __init__(self, model: MultiBladeModel, clip: float, max_rows: int,
                 multiplier: float = 0.0) -> None:
        self.selectors = [
            model.mask.expand_as(p).cpu().numpy() if name == "weight"
            else np.ones(p.shape, dtype=bool)
            for name, p in model.named_parameters()
        ]
        self.dimension = int(sum(s.sum() for s in self.selectors))
        self.grid, self.sensitivity = step_sensitivity(self.dimension, clip, max_rows,
                                                       multiplier)

    def privatize(self, sums: list[torch.Tensor], sigma2: Fraction | None) -> list[np.ndarray]:
        """The noisy sums (float64 arrays shaped like the parameters; masked entries 0).

        ``sigma2=None`` (an infinite budget) adds no noise.
        """
        flat = np.concatenate([s.cpu().numpy()[sel]
                               for s, sel in zip(sums, self.selectors, strict=True)])
        if sigma2 is None:
            noisy = flat
        else:
            units = np.asarray(self.grid.to_units(flat), dtype=np.int64)
            noisy = np.asarray(self.grid.from_units(noise.add_discrete_gaussian(units, sigma2)),
                               dtype=np.float64)
        out, at = [], 0
        for s, sel in zip(sums, self.selectors, strict=True):
            full = np.zeros(tuple(s.shape), dtype=np.float64)
            count = int(sel.sum())
            full[sel] = noisy[at:at + count]
            at += count
            out.append(full)
        return out


def train_dp(model: MultiBladeModel, index: torch.Tensor, config: DPSGDConfig,
             budget: PrivacyCost, rows_estimate: float, max_rows: int,
             rng: np.random.Generator, progress: Progress) -> dict[str, Any]:
    """Train ``model`` on the private rows ``index`` within ``budget`` (zCDP).

    Returns the JSON-able accounting record, whose ``cost`` is what was spent.

    ``rows_estimate`` (a DP or public row count) scales the noisy sum into a mean
    gradient; it must not be the private count.
    """
    multiplier = noise_multiplier(config.steps, budget)
    noisy = NoisyGradient(model, config.clip, max_rows, multiplier)
    step_noise: accounting.StepNoise | None = None
    if budget.infinite:  # exactness checks: no noise, and an unbounded cost
        cost = PrivacyCost.unbounded("zcdp")
    else:
        step_noise, cost = accounting.calibrate(budget, noisy.sensitivity, config.steps,
                                                noise.used_gaussian_sigma2)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    batch = max(config.sampling_rate * rows_estimate, 1.0)
    params = list(model.parameters())
    seconds = {"gradients": 0.0, "noise": 0.0}
    for step in range(config.steps):
        start = time.perf_counter()
        if config.sampling_rate < 1:
            keep = rng.random(index.shape[0]) < config.sampling_rate
            rows = index[torch.as_tensor(keep, device=index.device)]
        else:
            rows = index
        sums, _ = clipped_gradient_sum(model, rows, config.clip)
        middle = time.perf_counter()
        released = noisy.privatize(sums, step_noise.sigma2 if step_noise else None)
        seconds["gradients"] += middle - start
        seconds["noise"] += time.perf_counter() - middle
        optimizer.zero_grad(set_to_none=True)
        for p, g in zip(params, released, strict=True):
            p.grad = torch.as_tensor(g / batch, dtype=p.dtype, device=p.device)
        optimizer.step()
        progress("modp: DP-SGD", step + 1, config.steps)
    return {
        "steps": config.steps, "clip": config.clip, "sampling_rate": config.sampling_rate,
        "lr": config.lr, "noised_coordinates": noisy.dimension,
        "grid": str(noisy.grid.grid), "sensitivity_units": str(noisy.sensitivity),
        "sigma2_units": str(step_noise.sigma2) if step_noise else "0",
        "noise_multiplier": step_noise.multiplier if step_noise else 0.0,
        "accountant": "dp_accounting.rdp.RdpAccountant (Gaussian, max over orders of RDP/order)",
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "cost": cost,
    }
