"""k-tuples of attribute values: items, dense keys, lookup tables and candidates.

An *item* is one non-empty value of one column, numbered column by column
(``item = offset[column] + code``), so sorting items sorts them by column. A
k-tuple is k items of distinct columns, always stored sorted. Its *dense key*
indexes one flat space that holds a cell for every k-tuple of every set of k
columns: one block per column set (blocks in colex order of the sets, found by
the combinatorial number system) and a mixed-radix position inside the block.
Dense keys let numpy look tuples up with one gather instead of a hash map.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations

import numpy as np

from dpsql.domain import Domain

DENSE_LIMIT = 1 << 24  # cells; a larger key space is looked up by binary search instead
EMPTY = -1  # the item (or code) of an empty cell


class Items:
    """The items of a domain: each column's non-empty codes, numbered in column order.

    The NULL code of a nullable column is *empty*: it is no item and makes no tuple.
    """

    def __init__(self, domain: Domain) -> None:
        self.sizes = np.array([a.bins for a in domain.attributes], dtype=np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(self.sizes)[:-1])).astype(np.int64)
        self.count = int(self.sizes.sum())
        self.column = np.repeat(np.arange(len(self.sizes)), self.sizes).astype(np.int64)
        self.code = (np.arange(self.count) - self.offsets[self.column]).astype(np.int64)

    @property
    def columns(self) -> int:
        """Number of columns."""
        return len(self.sizes)

    def to_codes(self, rows: np.ndarray) -> np.ndarray:
        """Item rows -> per-column codes (EMPTY stays EMPTY)."""
        return np.where(rows == EMPTY, EMPTY, self.code[np.maximum(rows, 0)])

    def from_codes(self, codes: np.ndarray) -> np.ndarray:
        """Domain codes (rows x columns) -> items, EMPTY where the code is NULL or out of range."""
        codes = np.asarray(codes, dtype=np.int64)
        ok = (codes >= 0) & (codes < self.sizes)
        return np.where(ok, codes + self.offsets, EMPTY)


class TupleSpace:
    """Dense keys of the k-tuples over columns of the given ``sizes``."""

    def __init__(self, sizes: Sequence[int] | np.ndarray, k: int) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.k = k
        d = len(self.sizes)
        # binom[n, j] = C(n, j): the colex rank of columns c_0 < ... < c_{k-1} is sum C(c_j, j+1)
        self.binom = np.array([[math.comb(n, j) for j in range(k + 1)] for n in range(d + 1)],
                              dtype=np.int64)
        sets = list(combinations(range(d), k))
        ranks = [sum(math.comb(c, j + 1) for j, c in enumerate(s)) for s in sets]
        order = np.argsort(ranks)
        self.column_sets = np.array(sets, dtype=np.int64).reshape(-1, k)[order]
        block_sizes = np.prod(self.sizes[self.column_sets], axis=1) if k else np.ones(1, np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(block_sizes)[:-1])).astype(np.int64)
        self.total = int(block_sizes.sum())
        # strides[rank, j]: mixed radix inside a block, the last column fastest
        sub = self.sizes[self.column_sets]
        self.strides = np.ones_like(sub)
        for j in range(k - 2, -1, -1):
            self.strides[:, j] = self.strides[:, j + 1] * sub[:, j + 1]

    def rank(self, columns: np.ndarray) -> np.ndarray:
        """Colex rank of sorted column sets (..., k)."""
        return np.sum([self.binom[columns[..., j], j + 1] for j in range(self.k)], axis=0)

    def keys(self, columns: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Dense keys of tuples given their sorted columns and codes (..., k)."""
        r = self.rank(columns)
        return self.offsets[r] + (codes * self.strides[r]).sum(axis=-1)

    def record_keys(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Key each record's tuple on every column set, from the records' codes.

        Returns keys (records x sets, in the order of ``column_sets``; EMPTY codes
        make garbage keys; int32 where every key fits) and which tuples are full
        (no empty cell).
        """
        dtype = np.int32 if self.total < 2**31 else np.int64  # half the memory traffic
        codes = codes.astype(dtype)
        keys = np.repeat(self.offsets.astype(dtype)[None, :], len(codes), axis=0)
        for j in range(self.k):  # one column of each set at a time: no records x sets x k array
            keys += codes[:, self.column_sets[:, j]] * self.strides[:, j].astype(dtype)
        empty = codes == EMPTY
        if not empty.any():
            return keys, np.ones(keys.shape, dtype=bool)
        full = np.ones(keys.shape, dtype=bool)
        for j in range(self.k):
            full &= ~empty[:, self.column_sets[:, j]]
        return keys, full

    def item_keys(self, items: Items, tuples: np.ndarray) -> np.ndarray:
        """Dense keys of item tuples (..., k), each sorted ascending."""
        return self.keys(items.column[tuples], items.code[tuples])


class TupleTable:
    """A set of k-tuples (by dense key) with a value per tuple; absent tuples read as 0."""

    def __init__(self, space: TupleSpace, keys: np.ndarray, values: np.ndarray | None = None):
        self.space = space
        keys = np.asarray(keys, dtype=np.int64)
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.order = order  # table position of the i-th input tuple is argsort(order)[i]
        vals = np.zeros(len(keys)) if values is None else np.asarray(values)[order]
        self.values = vals
        self._dense: np.ndarray | None = None
        if space.total <= DENSE_LIMIT:
            self._dense = np.full(space.total, -1, dtype=np.int32)
            self._dense[self.keys] = np.arange(len(self.keys), dtype=np.int32)

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Table positions of ``keys`` (-1 where absent)."""
        if self._dense is not None:
            return self._dense[keys].astype(np.int64)
        pos = np.searchsorted(self.keys, keys)
        pos = np.minimum(pos, max(len(self.keys) - 1, 0))
        hit = (self.keys[pos] == keys) if len(self.keys) else np.zeros(np.shape(keys), bool)
        return np.where(hit, pos, -1)

    def get(self, keys: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
        """``values`` (default: the table's) at ``keys``, 0 where absent."""
        vals = self.values if values is None else values
        padded = np.append(vals, 0)  # position -1 reads the padding 0
        return padded[self.find(keys)]


def candidates(items: Items, survivors: np.ndarray, previous: TupleTable | None) -> np.ndarray:
    """Candidate k-tuples (sorted rows of items) whose every (k-1)-sub-tuple survived.

    ``survivors`` are the surviving (k-1)-tuples as sorted item rows (empty for
    k = 1: then every item is a candidate) and ``previous`` their table. This is
    the apriori join: two survivors sharing their first k-2 items extend each
    other, then every other sub-tuple is checked against ``previous``.
    """
    if previous is None:
        return np.arange(items.count, dtype=np.int64)[:, None]
    if len(survivors) == 0:
        return np.empty((0, survivors.shape[1] + 1), dtype=np.int64)
    km1 = survivors.shape[1]
    rows = survivors[np.lexsort(survivors.T[::-1])]
    prefix = rows[:, :-1]
    new_group = np.ones(len(rows), dtype=bool)
    if km1 > 1:
        new_group[1:] = np.any(prefix[1:] != prefix[:-1], axis=1)
    else:
        new_group[1:] = False
    starts = np.flatnonzero(new_group)
    ends = np.append(starts[1:], len(rows))
    group_end = np.repeat(ends, ends - starts)
    later = group_end - np.arange(len(rows)) - 1  # rows after each row in its group
    left = np.repeat(np.arange(len(rows)), later)
    first = np.repeat(np.cumsum(later) - later, later)
    right = left + 1 + (np.arange(len(left)) - first)
    last = rows[:, -1]
    keep = items.column[last[left]] < items.column[last[right]]
    left, right = left[keep], right[keep]
    joined = np.concatenate([rows[left], last[right][:, None]], axis=1)
    if km1 >= 2:  # sub-tuples dropping one of the first k-2 items must have survived too
        ok = np.ones(len(joined), dtype=bool)
        for j in range(km1 - 1):
            sub = np.delete(joined, j, axis=1)
            ok &= previous.find(previous.space.item_keys(items, sub)) >= 0
        joined = joined[ok]
    return joined
