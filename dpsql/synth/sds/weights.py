"""What aggregate-seeded synthesis reads from the DP aggregates: tuple counts and dependence.

Post-processing of the released aggregates only (:mod:`dpsql.synth.sds.aggregates`).
"""

from __future__ import annotations

from itertools import permutations

import numpy as np

from dpsql.synth.sds.aggregates import Level
from dpsql.synth.sds.tuples import Items

DENSE_TUPLES = 1 << 24  # items^k up to which k-tuples (k = 2, 3) are looked up densely


class Weights:
    """Counts of the released tuples, and (optionally) what synthesis has used of them."""

    def __init__(self, items: Items, levels: list[Level], scale: float,
                 use_synthetic_counts: bool) -> None:
        self.items = items
        self.levels = levels
        self.length = len(levels)
        self.scale = scale
        self.use_synthetic = use_synthetic_counts
        self.quotas = use_synthetic_counts  # whether weights subtract the synthetic counts now
        self.counts = [np.append(lv.table.values.astype(np.float64), 0.0) for lv in levels]
        self.used = [np.zeros(len(lv.table) + 1) for lv in levels]
        self.remaining = [c * scale for c in self.counts]  # count * scale - used, per position
        self.single = (levels[0].table.get(np.arange(items.count)).astype(np.float64)
                       if levels else np.zeros(items.count))
        # k -> item^k array of table positions, filled in every order of a tuple's items
        self._dense = {lv.k: _every_order(lv.rows, items.count) for lv in levels[1:3]
                       if items.count**lv.k <= DENSE_TUPLES}

    def positions(self, tuples: np.ndarray) -> np.ndarray:
        """Table positions of sorted item tuples (..., k), -1 where not released."""
        k = tuples.shape[-1]
        if k in self._dense:
            return self._dense[k][tuple(tuples[..., j] for j in range(k))]
        table = self.levels[k - 1].table
        return table.find(table.space.item_keys(self.items, tuples))

    def value(self, members: list[np.ndarray], complete: np.ndarray | None = None) -> np.ndarray:
        """Weigh tuples, given as one item array per member (in any order), by their counts.

        A weight <= 0 means the tuple may not be drawn. With synthetic counts the
        weight is what remains of the count (scaled to the requested rows) after the
        records already synthesized. Only the tuples marked ``complete`` (default: all)
        are read; the others may hold EMPTY members and weigh an arbitrary value.
        """
        k = len(members)
        if k in self._dense:  # no sort: every order of the items is filled in
            pos = self._dense[k][tuple(members)]
        else:
            pos = np.full(len(members[0]), -1, dtype=np.int64)
            at = slice(None) if complete is None else complete
            tuples = np.stack([m[at] for m in members], axis=-1)
            pos[at] = self.positions(np.sort(tuples, axis=-1))
        if not (self.use_synthetic and self.quotas):
            return self.counts[k - 1][pos]
        return self.remaining[k - 1][pos]

    def pair_counts(self, anchors: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """Released counts of the pairs (anchors[i], cand[j]), 0 where not released."""
        pairs = np.stack(np.broadcast_arrays(anchors[:, None], cand[None, :]), axis=-1)
        return self.counts[1][self.positions(np.sort(pairs, axis=-1))]

    def finish(self, rows: np.ndarray, checked: np.ndarray) -> int:
        """Count finished records (item rows) into the synthetic counts.

        Returns how many of the ``checked`` records have a combination (length <= R)
        that was not released.
        """
        part = rows if self.use_synthetic else rows[checked]
        codes = self.items.to_codes(part)
        outside = np.zeros(len(part), dtype=bool)
        for level in self.levels:
            if not len(part):
                break
            keys, full = level.table.space.record_keys(codes)
            pos = np.full(full.shape, -1, dtype=np.int64)
            pos[full] = level.table.find(keys[full])
            outside |= np.any(full & (pos < 0), axis=1)
            if self.use_synthetic:
                hit = pos[pos >= 0]
                used = self.used[level.k - 1]
                used[:-1] += np.bincount(hit, minlength=len(used) - 1)
                self.remaining[level.k - 1] = self.counts[level.k - 1] * self.scale - used
        if self.use_synthetic:
            outside &= checked
        return int(outside.sum())


def _every_order(rows: np.ndarray, count: int) -> np.ndarray:
    """A dense item^k array holding each k-tuple's position at all k! orders of its items."""
    k = rows.shape[1]
    dense = np.full((count,) * k, -1, dtype=np.int32)
    for order in permutations(range(k)):
        dense[tuple(rows[:, j] for j in order)] = np.arange(len(rows))
    return dense


def dependence(items: Items, levels: list[Level]) -> np.ndarray:
    """How much of each column one other column explains, from the released counts.

    ``out[c, a] = I(a; c) / H(c)`` over the distribution of the released pairs of
    columns a and c (1 when a determines c), times the share of the smaller
    column's 1-counts that those pairs hold. Without that share a table that
    thresholds left with one pair per value would look like a determination.
    """
    d = items.columns
    out = np.zeros((d, d))
    level = levels[1]
    w = np.maximum(level.table.values.astype(np.float64), 0.0)
    rows = level.rows[w > 0]
    w = w[w > 0]
    if not len(w):
        return out
    ca, cb = items.column[rows[:, 0]], items.column[rows[:, 1]]
    block = ca * d + cb
    p = w / np.bincount(block, weights=w, minlength=d * d)[block]

    def side(item: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per pair its value's marginal in the block, and per block that side's entropy."""
        keys, inverse = np.unique(block * items.count + item, return_inverse=True)
        marginal = np.bincount(inverse, weights=p)
        entropy = np.bincount(keys // items.count, weights=-marginal * np.log(marginal),
                              minlength=d * d)
        return marginal[inverse], entropy

    pa, ha = side(rows[:, 0])
    pb, hb = side(rows[:, 1])
    mi = np.bincount(block, weights=p * np.log(p / (pa * pb)), minlength=d * d)
    seen = np.unique(block)
    a, b = np.divmod(seen, d)  # released pairs have a < b
    ones = np.maximum(levels[0].table.get(np.arange(items.count)).astype(np.float64), 0.0)
    mass = np.bincount(items.column, weights=ones, minlength=d)
    held = np.bincount(block, weights=w, minlength=d * d)[seen]
    share = np.divide(held, np.minimum(mass[a], mass[b]), out=np.zeros(len(seen)),
                      where=np.minimum(mass[a], mass[b]) > 0)
    share = np.clip(share, 0.0, 1.0)
    out[b, a] = share * np.divide(mi[seen], hb[seen], out=np.zeros(len(seen)), where=hb[seen] > 0)
    out[a, b] = share * np.divide(mi[seen], ha[seen], out=np.zeros(len(seen)), where=ha[seen] > 0)
    return np.clip(out, 0.0, 1.0)
