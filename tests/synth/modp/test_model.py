"""The MODP model: exactly minus-one, the paper's one-blade form, the mask through training."""

from __future__ import annotations

import pytest
import torch

from dpsql.synth.modp.blocks import Blocks
from dpsql.synth.modp.model import MultiBladeModel, parameter_count
from dpsql.synth.modp.train import Schedule, train_empirical

from .conftest import random_index


def _model(blocks: Blocks, blades: int, seed: int = 0) -> MultiBladeModel:
    model = MultiBladeModel(blocks, blades, 4, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():  # make the biases and weights all matter
        model.bias.normal_(generator=torch.Generator().manual_seed(seed + 1))
    return model


def _assert_minus_one(model: MultiBladeModel, blocks: Blocks, index: torch.Tensor) -> None:
    """Changing only column J's input leaves column J's output bit-for-bit unchanged (and,
    so the check has power, changes some other column's output)."""
    base = model(index)
    starts = blocks.starts
    others_changed = False
    for column, size in enumerate(blocks.sizes):
        for code in range(size):
            changed = index.clone()
            changed[:, column] = starts[column] + code
            out = model(changed)
            own = slice(starts[column], starts[column + 1])
            assert torch.equal(out[:, own], base[:, own]), (column, code)
            others_changed |= not torch.equal(out, base)
        padded = index.clone()
        padded[:, column] = blocks.pad  # a value outside the domain
        own = slice(starts[column], starts[column + 1])
        assert torch.equal(model(padded)[:, own], base[:, own])
    assert others_changed


@pytest.mark.parametrize("blades", [1, 3], ids=["one_blade", "three_blades"])
def test_no_column_predicts_itself(blocks: Blocks, blades: int) -> None:
    model = _model(blocks, blades)
    _assert_minus_one(model, blocks, random_index(blocks, 64, missing=0.1))


def test_one_blade_is_the_papers_masked_logistic_map(blocks: Blocks) -> None:
    model = _model(blocks, 1)
    index = random_index(blocks, 32)
    x = blocks.one_hot(index)
    weight = model.weight[0].detach().clone()
    for start, end in zip(blocks.starts[:-1], blocks.starts[1:], strict=True):
        weight[start:end, start:end] = 0  # the paper's zero_blocks()
    expected = torch.sigmoid(x @ weight + model.bias[0].detach())
    torch.testing.assert_close(model(index), expected)


def test_blades_mix_with_minus_one_softmax_weights(blocks: Blocks) -> None:
    model = _model(blocks, 3)
    index = random_index(blocks, 16)
    fwd = model.run(index)
    assert fwd.weights is not None
    torch.testing.assert_close(fwd.weights.sum(dim=-1), torch.ones(16, len(blocks)))
    # column J's weights come from the row with column J removed
    x = blocks.one_hot(index)
    for column, (start, end) in enumerate(zip(blocks.starts[:-1], blocks.starts[1:], strict=True)):
        without = x.clone()
        without[:, start:end] = 0
        hidden = torch.relu(without @ model.fc1 + model.fc1_bias)
        expected = torch.softmax(model.fc2(hidden), dim=-1)
        torch.testing.assert_close(fwd.weights[:, column, :], expected)
        mixed = torch.einsum("rk,rkw->rw", expected, torch.sigmoid(fwd.logits[:, :, start:end]))
        torch.testing.assert_close(fwd.output[:, start:end], mixed)


def test_mask_survives_training(blocks: Blocks) -> None:
    model = _model(blocks, 3)
    before = model.weight.detach().clone()
    index = random_index(blocks, 256, seed=3)
    train_empirical(model, index, Schedule(warmup_epochs=2, epochs=5, batch_size=64, lr=0.05),
                    torch.Generator().manual_seed(0), lambda *a: None)
    same = blocks.same_block()
    moved = model.weight.detach() != before
    assert moved[:, ~same].any()  # training changed the free weights...
    assert not moved[:, same].any()  # ...and never the self-predicting ones
    assert torch.all(model.masked_weight()[:, same] == 0)
    _assert_minus_one(model, blocks, random_index(blocks, 32, seed=4))


def test_start_from_marginals_is_the_independent_model(blocks: Blocks) -> None:
    model = _model(blocks, 3)
    probs = torch.rand(blocks.width, generator=torch.Generator().manual_seed(5)) * 0.8 + 0.1
    model.start_from_marginals(probs, scale=0.0)
    out = model(random_index(blocks, 8))
    torch.testing.assert_close(out, probs.expand(8, -1))


def test_parameter_count_excludes_masked_weights(blocks: Blocks) -> None:
    model = _model(blocks, 2)
    width, reduced = blocks.width, 4
    free = width * width - sum(s * s for s in blocks.sizes)
    assert model.parameter_count() == 2 * free + 2 * width + width * reduced + reduced \
        + reduced * 2 + 2


@pytest.mark.parametrize(("blades", "reduced"), [(1, 15), (2, 4), (5, 15)])
def test_the_forecast_counts_the_parameters_without_building_the_model(
        blocks: Blocks, blades: int, reduced: int) -> None:
    built = MultiBladeModel(blocks, blades, reduced, generator=torch.Generator().manual_seed(0))
    assert parameter_count(blocks, blades, reduced) == built.parameter_count()
    # ... which is what DP-SGD noises (its selectors: the masked weights, every other tensor).
    from dpsql.synth.modp.dpsgd import NoisyGradient

    assert NoisyGradient(built, clip=1.0, max_rows=1).dimension == built.parameter_count()
