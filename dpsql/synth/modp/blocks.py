"""One-hot block layout of a domain: each column is a block of adjacent categories.

MODP (Press 2024, sec. 3.1) works on the concatenated one-hot encoding of a row.
Rows travel as integer index tensors (one global category index per column),
never as dense one-hot matrices: an input row is one-hot, so a linear map of it
is a sum of ``Q`` table rows, which is what ``embedding_bag`` computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from dpsql.domain import Domain


@dataclass(frozen=True)
class Blocks:
    """Category blocks: column ``J`` owns global categories ``starts[J]:starts[J+1]``.

    The extra index ``width`` is padding: a code outside the public domain (NULL
    from the encoder) maps to it, and it contributes nothing to any output.
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    @classmethod
    def from_domain(cls, domain: Domain) -> Blocks:
        """The layout of a domain's codes, one block per column."""
        return cls(domain.names, domain.shape)

    @property
    def starts(self) -> tuple[int, ...]:
        """Block boundaries, ``len(sizes) + 1`` of them (the paper's ``block_starts``)."""
        return tuple(int(s) for s in np.concatenate([[0], np.cumsum(self.sizes)]))

    @property
    def width(self) -> int:
        """Total number of categories (the paper's script N)."""
        return int(sum(self.sizes))

    @property
    def pad(self) -> int:
        """The padding index (outside every block)."""
        return self.width

    def __len__(self) -> int:
        return len(self.sizes)

    def block_of(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """For each category, the index of its block (``width`` entries; cached)."""
        return _block_of(self.sizes, str(device))

    def same_block(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``width x width`` bool: True where two categories share a column (cached)."""
        return _same_block(self.sizes, str(device))

    def indicator(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``width x Q`` float matrix: 1 where a category belongs to a column (cached)."""
        return _indicator(self.sizes, str(device))

    def to_index(self, codes: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
        """Per-column codes (``rows x Q``, -1 for outside the domain) -> global indices."""
        codes = np.asarray(codes, dtype=np.int64)
        offsets = np.asarray(self.starts[:-1], dtype=np.int64)
        index = np.where(codes >= 0, codes + offsets, self.pad)
        return torch.as_tensor(index, dtype=torch.long, device=device)

    def to_codes(self, index: torch.Tensor) -> np.ndarray:
        """Global indices -> per-column codes (-1 for padding)."""
        offsets = torch.tensor(self.starts[:-1], device=index.device)
        codes = torch.where(index == self.pad, torch.full_like(index, -1), index - offsets)
        return codes.cpu().numpy()

    def one_hot(self, index: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dense ``rows x width`` one-hot rows (padding drops out)."""
        dense = torch.zeros(index.shape[0], self.width + 1, dtype=dtype, device=index.device)
        dense.scatter_(1, index, 1.0)
        return dense[:, : self.width]


@lru_cache(maxsize=16)
def _block_of(sizes: tuple[int, ...], device: str) -> torch.Tensor:
    counts = torch.tensor(sizes, device=device)
    return torch.repeat_interleave(torch.arange(len(sizes), device=device), counts)


@lru_cache(maxsize=16)
def _same_block(sizes: tuple[int, ...], device: str) -> torch.Tensor:
    block = _block_of(sizes, device)
    return block[:, None] == block[None, :]


@lru_cache(maxsize=16)
def _indicator(sizes: tuple[int, ...], device: str) -> torch.Tensor:
    block = _block_of(sizes, device)
    return (block[:, None] == torch.arange(len(sizes), device=device)[None, :]).float()
