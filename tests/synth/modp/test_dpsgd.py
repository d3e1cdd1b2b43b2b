"""DP-SGD internals: ghost per-example norms and clipped sums against per-row autograd,
the fixed-point sensitivity, and the noise on the right coordinates."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from dpsql import noise
from dpsql.synth.modp.blocks import Blocks
from dpsql.synth.modp.dpsgd import (
    GRID_UNITS,
    NoisyGradient,
    clipped_gradient_sum,
    grid_units,
    per_example_sq_norms,
)
from dpsql.synth.modp.losses import per_example_mse
from dpsql.synth.modp.model import MultiBladeModel

from .conftest import random_index


def _model(blocks: Blocks, blades: int) -> MultiBladeModel:
    model = MultiBladeModel(blocks, blades, 4, generator=torch.Generator().manual_seed(7))
    model.double()
    return model


def _per_row_grads(model: MultiBladeModel, index: torch.Tensor) -> list[list[torch.Tensor]]:
    """The reference: each row's gradient by its own backward pass."""
    out = []
    for row in index.split(1):
        loss = per_example_mse(model(row), model.blocks.one_hot(row, torch.float64)).sum()
        out.append([g.detach() for g in torch.autograd.grad(loss, list(model.parameters()))])
    return out


@pytest.mark.parametrize("blades", [1, 3], ids=["one_blade", "three_blades"])
def test_ghost_norms_equal_per_row_gradient_norms(blocks: Blocks, blades: int) -> None:
    model = _model(blocks, blades)
    index = random_index(blocks, 24, seed=1, missing=0.15)
    fwd = model.run(index)
    losses = per_example_mse(fwd.output, blocks.one_hot(index, torch.float64))
    inter = [t for t in (fwd.logits, fwd.hidden, fwd.scores) if t is not None]
    signals = torch.autograd.grad(losses.sum(), inter)
    extra = (signals[1], signals[2]) if blades > 1 else (None, None)
    ghost = per_example_sq_norms(model, index, fwd, signals[0], *extra)
    reference = torch.tensor([sum(float((g**2).sum()) for g in grads)
                              for grads in _per_row_grads(model, index)], dtype=torch.float64)
    torch.testing.assert_close(ghost.double(), reference, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("blades", [1, 3], ids=["one_blade", "three_blades"])
def test_clipped_sum_equals_sum_of_clipped_row_gradients(blocks: Blocks, blades: int) -> None:
    model = _model(blocks, blades)
    index = random_index(blocks, 24, seed=2, missing=0.1)
    per_row = _per_row_grads(model, index)
    norms = [math.sqrt(sum(float((g**2).sum()) for g in grads)) for grads in per_row]
    clip = float(np.median(norms))  # half the rows are clipped
    sums, got_norms = clipped_gradient_sum(model, index, clip)
    torch.testing.assert_close(got_norms.double(), torch.tensor(norms, dtype=torch.float64),
                               rtol=1e-5, atol=1e-9)
    for j, total in enumerate(sums):
        expected = sum(min(1.0, clip / n) * grads[j]
                       for n, grads in zip(norms, per_row, strict=True))
        torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-6)  # float32 norms


def test_masked_weights_get_no_gradient_and_no_noise(blocks: Blocks) -> None:
    model = _model(blocks, 2)
    noisy = NoisyGradient(model, clip=1.0, max_rows=1)
    assert noisy.dimension == model.parameter_count()
    sums, _ = clipped_gradient_sum(model, random_index(blocks, 16), 1.0)
    same = blocks.same_block()
    assert torch.all(sums[0][:, same] == 0)
    released = noisy.privatize(sums, Fraction(10**12))  # huge noise...
    assert np.all(released[0][:, same.numpy()] == 0)  # ...but none on masked weights
    assert np.all(released[0][:, ~same.numpy()] != 0)
    exact = noisy.privatize(sums, None)  # an infinite budget: the sums themselves
    for got, total in zip(exact, sums, strict=True):
        np.testing.assert_array_equal(got, total.numpy())


def test_fixed_point_sensitivity_covers_rounding(blocks: Blocks) -> None:
    model = _model(blocks, 2)
    clip, max_rows = 0.5, 3
    noisy = NoisyGradient(model, clip, max_rows)
    grid = Fraction(noisy.grid.grid)
    assert max_rows * clip / grid <= GRID_UNITS
    assert noisy.sensitivity == max_rows * Fraction(clip) / grid \
        + math.ceil(math.sqrt(noisy.dimension))
    # neighbours: one privacy unit (max_rows rows) more; rounded sums stay within it
    index = random_index(blocks, 40, seed=5)
    base, _ = clipped_gradient_sum(model, index[:37], clip)
    more, _ = clipped_gradient_sum(model, index, clip)

    def units(sums: list[torch.Tensor]) -> np.ndarray:
        flat = np.concatenate([s.numpy()[sel]
                               for s, sel in zip(sums, noisy.selectors, strict=True)])
        return np.asarray(noisy.grid.to_units(flat), dtype=np.int64)

    gap = units(more) - units(base)
    assert math.sqrt(float((gap.astype(float) ** 2).sum())) <= float(noisy.sensitivity)


@pytest.mark.parametrize("multiplier", [0.5, 60.0, 5000.0, 1e6])
def test_grid_keeps_the_noise_within_the_samplers_range(blocks: Blocks, multiplier: float
                                                        ) -> None:
    model = _model(blocks, 2)
    noisy = NoisyGradient(model, 1.0, 1, multiplier)
    sigma = multiplier * float(noisy.sensitivity)
    assert sigma <= noise.MAX_GAUSSIAN_SIGMA
    units = grid_units(multiplier, math.isqrt(noisy.dimension - 1) + 1)
    if units < GRID_UNITS:  # as fine as fits: twice as many steps would overflow
        assert multiplier * (2 * units + math.isqrt(noisy.dimension - 1) + 1) \
            > noise.MAX_GAUSSIAN_SIGMA / 1.01
