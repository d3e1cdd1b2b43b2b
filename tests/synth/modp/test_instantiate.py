"""``instantiate``: draws follow the given probabilities; entropies are exact.

Every goodness-of-fit check below is a chi-square test at level
FALSE_POSITIVE_RATE (the chance that a correct sampler fails it, for a random
seed); the seeds are fixed, so the run is reproducible. Each check is paired
with a wrong distribution that the same test must reject.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpsql.synth.modp.blocks import Blocks
from dpsql.synth.modp.instantiate import instantiate

FALSE_POSITIVE_RATE = 1e-6
ROWS = 40_000
BLOCKS = Blocks(("a", "b", "c"), (3, 5, 2))
# unnormalized, as the model's sigmoid outputs are
RAW = torch.tensor([0.2, 0.6, 0.2, 0.05, 0.1, 0.15, 0.3, 0.4, 0.9, 0.3])


def _probabilities(raw: torch.Tensor) -> list[np.ndarray]:
    raw = raw.double()
    return [raw[s:e].numpy() / raw[s:e].sum().item()
            for s, e in zip(BLOCKS.starts[:-1], BLOCKS.starts[1:], strict=True)]


def _chi2_pvalue(codes: np.ndarray, p: np.ndarray) -> float:
    observed = np.bincount(codes, minlength=len(p))
    return float(stats.chisquare(observed, ROWS * p).pvalue)


def _draw(raw: torch.Tensor, seed: int, **kwargs: object) -> tuple[np.ndarray, torch.Tensor]:
    probs = raw.expand(ROWS, -1)
    index, bits = instantiate(probs, BLOCKS, torch.Generator().manual_seed(seed), **kwargs)
    return BLOCKS.to_codes(index), bits


def test_frequencies_match_normalized_probabilities() -> None:
    codes, _ = _draw(RAW, seed=1)
    for column, p in enumerate(_probabilities(RAW)):
        assert _chi2_pvalue(codes[:, column], p) > FALSE_POSITIVE_RATE


def test_the_check_rejects_wrong_probabilities() -> None:
    codes, _ = _draw(RAW, seed=2)
    for column, p in enumerate(_probabilities(RAW)):
        wrong = p * np.linspace(0.8, 1.2, len(p))  # a 20% tilt
        assert _chi2_pvalue(codes[:, column], wrong / wrong.sum()) < FALSE_POSITIVE_RATE


def test_columns_are_drawn_independently() -> None:
    codes, _ = _draw(RAW, seed=3)
    table = np.zeros((3, 5))
    np.add.at(table, (codes[:, 0], codes[:, 1]), 1)
    assert stats.chi2_contingency(table).pvalue > FALSE_POSITIVE_RATE


def test_entropy_is_exact_on_known_distributions() -> None:
    uniform = torch.ones(1, BLOCKS.width) * 0.3  # log2(3) + log2(5) + 1 bits
    _, bits = instantiate(uniform, BLOCKS, torch.Generator().manual_seed(0))
    assert bits.item() == pytest.approx(math.log2(3) + math.log2(5) + 1, abs=1e-12)
    certain = torch.tensor([[1.0, 0, 0, 0, 0, 0, 1, 0, 0, 1]])  # one category per column
    index, bits = instantiate(certain, BLOCKS, torch.Generator().manual_seed(0))
    assert bits.item() == pytest.approx(0.0, abs=1e-9)
    assert BLOCKS.to_codes(index).tolist() == [[0, 3, 1]]
    expected = sum(-(p * np.log2(p)).sum() for p in _probabilities(RAW))
    _, bits = instantiate(RAW[None, :], BLOCKS, torch.Generator().manual_seed(0))
    assert bits.item() == pytest.approx(expected, abs=1e-9)


def test_passthrough_mixes_in_the_true_value() -> None:
    true = BLOCKS.to_index(np.array([[1, 4, 0]])).expand(ROWS, -1)
    p = 0.5
    codes, bits = _draw(RAW, seed=4, passthrough=p, true_index=true)
    mixed = []
    for column, q in enumerate(_probabilities(RAW)):
        own = np.zeros_like(q)
        own[int(true[0, column]) - BLOCKS.starts[column]] = 1
        mixture = (1 - p) * q + p * own
        mixed.append(mixture)
        assert _chi2_pvalue(codes[:, column], mixture) > FALSE_POSITIVE_RATE
        assert _chi2_pvalue(codes[:, column], q) < FALSE_POSITIVE_RATE  # not the plain model
    expected = sum(-(m * np.log2(m)).sum() for m in mixed)
    assert bits[0].item() == pytest.approx(expected, abs=1e-9)
