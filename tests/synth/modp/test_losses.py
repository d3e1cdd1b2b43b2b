"""MODP's losses against hand computations."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from dpsql.synth.modp.blocks import Blocks
from dpsql.synth.modp.losses import mse, normalize_blocks, per_example_mse, zval_loss

TWO_BY_TWO = Blocks(("a", "b"), (2, 2))
# raw sigmoid outputs; per block they normalize to (3/4, 1/4 | 1/2, 1/2) and (1/4, 3/4 | 1/4, 3/4)
OUTPUT = torch.tensor([[0.6, 0.2, 0.3, 0.3], [0.1, 0.3, 0.2, 0.6]], dtype=torch.float64)
TARGET = torch.tensor([[1, 0, 0, 1], [0, 1, 0, 1]], dtype=torch.float64)


def _zval_by_hand() -> Fraction:
    """Eq. (10) cell by cell in exact arithmetic: pseudocount 1/100, variance floor that of
    a cell with 1/20 row of the batch (n = 2: (1/20) / 2 * (1/2 + 1/2) = 1/40), same-column
    cells zero, mean over all 16 cells."""
    q = [[Fraction(3, 4), Fraction(1, 4), Fraction(1, 2), Fraction(1, 2)],
         [Fraction(1, 4), Fraction(3, 4), Fraction(1, 4), Fraction(3, 4)]]
    t = [[1, 0, 0, 1], [0, 1, 0, 1]]
    column = [0, 0, 1, 1]
    n, pseudo, floor = 2, Fraction(1, 100), Fraction(1, 40)
    total = Fraction(0)
    for i in range(4):
        for j in range(4):
            if column[i] == column[j]:
                continue
            c_out = sum(r[i] * r[j] for r in q) + pseudo
            c_true = sum(r[i] * r[j] for r in t) + pseudo
            pooled = (c_true + c_out) / (2 * n)
            var = pooled * (1 - pooled) * Fraction(2, n)
            total += (c_true / n - c_out / n) ** 2 / (var + floor)
    return total / 16


def test_zval_loss_matches_hand_computation() -> None:
    expected = _zval_by_hand()
    assert float(expected) == pytest.approx(0.111477960678558, rel=1e-12)
    got = zval_loss(OUTPUT, TARGET, TWO_BY_TWO)
    assert float(got) == pytest.approx(float(expected), rel=1e-6)  # float32 inside


def test_zval_loss_is_zero_when_output_is_the_target() -> None:
    assert float(zval_loss(TARGET, TARGET, TWO_BY_TWO)) == 0.0
    assert float(zval_loss(OUTPUT, TARGET, TWO_BY_TWO)) > 0.1


def test_normalize_blocks() -> None:
    expected = torch.tensor([[0.75, 0.25, 0.5, 0.5], [0.25, 0.75, 0.25, 0.75]],
                            dtype=torch.float64)
    torch.testing.assert_close(normalize_blocks(OUTPUT, TWO_BY_TWO), expected)


def test_mse_and_per_example_mse() -> None:
    per_row = [0.16 + 0.04 + 0.09 + 0.49, 0.01 + 0.49 + 0.04 + 0.16]
    torch.testing.assert_close(per_example_mse(OUTPUT, TARGET),
                               torch.tensor(per_row, dtype=torch.float64))
    assert float(mse(OUTPUT, TARGET)) == pytest.approx(sum(per_row) / 8)
