"""Fixtures for the MODP tests: small block layouts and random rows (CPU only)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="MODP needs the modp extra: pip install 'dpsql[modp]'")
pytest.importorskip("dp_accounting", reason="MODP needs the modp extra: pip install 'dpsql[modp]'")

from dpsql.synth.modp.blocks import Blocks  # noqa: E402


@pytest.fixture
def blocks() -> Blocks:
    """Four columns of 3, 4, 2 and 5 categories."""
    return Blocks(("a", "b", "c", "d"), (3, 4, 2, 5))


def random_index(blocks: Blocks, rows: int, seed: int = 0, missing: float = 0.0) -> torch.Tensor:
    """Random rows as global category indices; a ``missing`` share of cells is padding."""
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, s, rows) for s in blocks.sizes], axis=1)
    if missing:
        codes[rng.random(codes.shape) < missing] = -1
    return blocks.to_index(codes)


@pytest.fixture(autouse=True, scope="package")
def _one_torch_thread() -> Iterator[None]:
    """These models are tiny: one intra-op thread is faster than two, and much faster
    when other test processes share the cores (oversubscribed threads spin)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
