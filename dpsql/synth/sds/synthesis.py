"""Aggregate-seeded synthesis: build records attribute by attribute from the DP aggregates.

Step (ii) of SDS, post-processing of the aggregates only. Each record starts
empty; the next item is drawn, among the available items of columns the record
does not have yet, with a weight read from the aggregates: the count of the
record plus the item while that is at most R attributes long, otherwise the
``weight_selection_percentile`` of the counts of every sub-combination (length
<= R) that contains the item. An item is never drawn if any such
sub-combination is absent from the aggregates, nor when its single-attribute
allowance (its 1-count scaled to the requested rows) is used up. With
``use_synthetic_counts`` every count is replaced by what remains of it after
the records already synthesized (and a used-up combination is not drawn).

dpsql runs this loop for a batch of records at once, each step adding one
item to every record of the batch, and keeps per (record, candidate) the state
that the next steps need: adding item x to a record only creates the
sub-combinations that contain x, so each step looks up only those and merges
them into a running top-k of weights from which the percentile is read.

SDS ends a record when no item can be added and leaves its other cells empty.
With many columns and much noise most records end early (on the 22 ACS
columns at epsilon 1, after about ten), and an empty cell is wrong where the
data is never empty. dpsql therefore continues each unfinished record with
the same loop at reporting length R-1, ..., 2 (the rules above with shorter
combinations: a relaxation, reported in the diagnostics), then with the
*paired pass*, then at length 1; a last pass fills the columns that are never
empty in the data ignoring the allowances. A nullable column still open at
the end is empty.

The paired pass. A record still open after length 2 has, in each open column,
no value whose every pair with the record was released (with count left).
Drawn from its 1-counts alone (length 1), the value would be independent of
the record: a record with industry code 170 would get any industry category,
and the 2-way tables would fill with combinations the data does not have.
(A record can also be open because allowances ran out.) The paired pass fills
one open column at a time (in random order) from the released counts of its
pairs with one filled column, its *anchor*: the filled column that explains
the largest share of the open column's entropy (``I(a; c) / H(c)`` over the
released 2-way counts of the two columns, times the share of the records those
pairs hold; see :func:`dpsql.synth.sds.weights.dependence`). Value v is drawn with weight
``count(anchor value, v)`` times the share of v's allowance still unused, so
1-counts stay close to their targets. A cell with no positive weight is tried
again once its record gains a value, and otherwise left to the length-1 pass.
It reads released counts only: post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from itertools import combinations
from typing import Any

import numpy as np

from dpsql.progress import Progress
from dpsql.synth.sds.aggregates import Level
from dpsql.synth.sds.tuples import EMPTY, Items
from dpsql.synth.sds.weights import Weights, dependence

PAIRS_PER_BATCH = 200_000  # (record, candidate) pairs alive at the start of a batch
SUBSETS_AT_ONCE = 32  # sub-combinations merged into a new pair's state at a time


@dataclass(frozen=True)
class Options:
    """The synthesis parameters."""

    use_synthetic_counts: bool
    weight_selection_percentile: int
    paired_pass: bool = True


def _percentile(top: np.ndarray, count: np.ndarray, q: float, descending: bool) -> np.ndarray:
    """Read the q-percentile of ``count`` values per row from their extremes kept in ``top``.

    Linear interpolation (numpy's default); ``top`` holds each row's largest
    values (``descending``) or its smallest.
    """
    h = q * (count - 1)
    lo = np.floor(h).astype(np.int64)
    frac = h - lo
    hi = np.minimum(lo + 1, count - 1)
    if descending:
        a_idx, b_idx = count - 1 - lo, count - 1 - hi
    else:
        a_idx, b_idx = lo, hi
    rows = np.arange(len(top))
    a, b = top[rows, a_idx], top[rows, b_idx]
    return a + frac * (b - a)


def _kept(q: float, longest: int) -> tuple[int, bool]:
    """How many extreme values a row must keep to read the q-percentile of up to ``longest``."""
    sizes = np.arange(1, longest + 1)
    lo = np.floor(q * (sizes - 1)).astype(np.int64)
    if q >= 0.5:
        return int((sizes - lo).max()), True
    return int(lo.max()) + 2, False


def _draw(groups: np.ndarray, weights: np.ndarray, n_groups: int,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One index per group, with probability proportional to ``weights`` (groups sorted).

    Returns the chosen index per group and whether the group had any positive weight.
    """
    w = np.where(weights > 0, weights, 0.0)
    cum = np.cumsum(w)
    starts = np.searchsorted(groups, np.arange(n_groups), side="left")
    ends = np.searchsorted(groups, np.arange(n_groups), side="right")
    before = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], 0.0)
    total = np.where(ends > starts, cum[np.maximum(ends - 1, 0)] - before, 0.0)
    ok = total > 0
    target = before + rng.random(n_groups) * total
    pick = np.searchsorted(cum, target, side="right")
    pick = np.clip(pick, starts, np.maximum(ends - 1, starts))
    return np.minimum(pick, max(len(w) - 1, 0)), ok


def _over_allowance(chosen: np.ndarray, allowance: np.ndarray,
                    rng: np.random.Generator) -> np.ndarray:
    """Records whose drawn item ran out of allowance within this step (they draw again).

    All records of a batch draw at once; of those that drew the same item only
    as many as its remaining allowance (rounded up) keep it, chosen at random.
    """
    rows = np.flatnonzero(chosen != EMPTY)
    order = rows[np.lexsort((rng.random(len(rows)), chosen[rows]))]
    items = chosen[order]
    first = np.searchsorted(items, items, side="left")
    rank = np.arange(len(order)) - first
    wait = np.zeros(len(chosen), dtype=bool)
    wait[order] = rank >= np.ceil(allowance[items])
    return wait


def _insert(top: np.ndarray, values: list[np.ndarray], descending: bool) -> np.ndarray:
    """Merge ``values`` (one array per new value) into each row's kept extremes ``top``.

    ``top`` is sorted (largest first when ``descending``) and keeps its width:
    each new value bubbles down the row by compare-exchange, a few whole-column
    operations instead of a sort of every row. Position by position, so that
    each position is final once its column is written.
    """
    out = np.empty_like(top)
    better, worse = (np.maximum, np.minimum) if descending else (np.minimum, np.maximum)
    carries = list(values)
    last = top.shape[1] - 1
    for i in range(top.shape[1]):
        current = top[:, i]
        for j, carry in enumerate(carries):
            kept = better(current, carry, out=out[:, i] if j == len(carries) - 1 else None)
            if i < last:
                carries[j] = worse(current, carry)
            current = kept
        if not carries:
            out[:, i] = current
    return out


@dataclass(frozen=True)
class _Pairs:
    """(record, candidate item) pairs still open, sorted by record, with their weight state.

    The state is the kept extreme values, how many values were seen, and the
    direct look-up.
    """

    owner: np.ndarray
    cand: np.ndarray
    top: np.ndarray
    count: np.ndarray
    direct: np.ndarray

    def take(self, which: np.ndarray) -> _Pairs:
        """The pairs selected by a mask or an index array."""
        return _Pairs(self.owner[which], self.cand[which], self.top[which], self.count[which],
                      self.direct[which])


@dataclass
class _Batch:
    """Records being built: items by column, items in the order added, and their number."""

    record: np.ndarray
    sequence: np.ndarray
    size: np.ndarray

    @classmethod
    def empty(cls, n: int, d: int) -> _Batch:
        return cls(np.full((n, d), EMPTY, dtype=np.int64), np.full((n, d), EMPTY, dtype=np.int64),
                   np.zeros(n, dtype=np.int64))

    def add(self, rows: np.ndarray, x: np.ndarray, column: np.ndarray) -> None:
        self.record[rows, column] = x
        self.sequence[rows, self.size[rows]] = x
        self.size[rows] += 1


class Synthesizer:
    """Samples records (as item rows) from released aggregates."""

    def __init__(self, items: Items, levels: list[Level], nullable: np.ndarray,
                 options: Options) -> None:
        self.items = items
        self.levels = levels
        self.nullable = np.asarray(nullable, dtype=bool)
        self.options = options
        self.length = len(levels)
        longest = sum(math.comb(max(items.columns - 1, 0), s) for s in range(max(self.length, 1)))
        self.q = options.weight_selection_percentile / 100
        self.keep, self.descending = _kept(self.q, max(longest, 1))

    def sample(self, n: int, rows: int, rng: np.random.Generator,
               progress: Progress | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """``n`` records as item rows (EMPTY for empty cells) and diagnostics."""
        d = self.items.columns
        weights = Weights(self.items, self.levels, n / max(rows, 1),
                          self.options.use_synthetic_counts)
        allowance = weights.single * weights.scale
        batch = max(16, min(4096, PAIRS_PER_BATCH // max(self.items.count, 1)))
        out = np.full((n, d), EMPTY, dtype=np.int64)
        stages = self.stages()
        filled = {name: 0 for name, *_ in stages}
        outside = 0
        done = 0
        while done < n:
            size = min(batch, n - done)
            state = _Batch.empty(size, d)
            relaxed = np.zeros(size, dtype=bool)
            for name, length, quotas, respect_allowance in stages:
                before = state.size.copy()
                weights.quotas = quotas
                if name == "paired":
                    self._pair_fill(state, weights, allowance, rng)
                else:
                    self._grow(state, length, weights, allowance, rng, respect_allowance)
                filled[name] += int((state.size - before).sum())
                if name == "paired" or length < self.length or not respect_allowance:
                    relaxed |= state.size > before
            outside += weights.finish(state.record, relaxed)
            out[done:done + size] = state.record
            done += size
            if progress:
                progress("sds: synthesis", done, n)
        return out, {"cells_filled": filled, "records_outside_aggregates": outside,
                     "empty_cells": int((out == EMPTY).sum())}

    def stages(self) -> list[tuple[str, int, bool, bool]]:
        """The loop's passes: (name, reporting length, synthetic counts, allowances).

        SDS itself, then the same rules at shorter lengths down to 2, the paired
        pass, length 1, and the never-empty columns without allowances.
        """
        synthetic = self.options.use_synthetic_counts
        passes = [(f"length_{k}", k, synthetic, True) for k in range(self.length, 1, -1)]
        if self.options.paired_pass and self.length >= 2:
            passes.append(("paired", 2, False, True))
        return [*passes, ("length_1", 1, synthetic, True), ("without_allowance", 1, False, False)]

    @cached_property
    def _dependence(self) -> np.ndarray:
        return dependence(self.items, self.levels)

    def _pair_fill(self, batch: _Batch, weights: Weights, allowance: np.ndarray,
                   rng: np.random.Generator) -> None:
        """The paired pass (module docstring): fill open cells from pair counts with an anchor."""
        items = self.items
        n, d = batch.record.shape
        start = np.maximum(weights.single * weights.scale, 1e-12)  # allowances before synthesis
        tried = np.zeros((n, d), dtype=bool)
        while True:
            open_cells = (batch.record == EMPTY) & ~tried
            rows = np.flatnonzero(open_cells.any(axis=1))
            if not len(rows):
                return
            column = np.argmax(np.where(open_cells[rows], rng.random((len(rows), d)), -1.0),
                               axis=1)
            chosen = np.full(n, EMPTY, dtype=np.int64)
            unused = allowance / start
            for c in np.unique(column):
                r = rows[column == c]
                chosen[r] = self._draw_paired(batch.record[r], c, weights, unused, rng)
                tried[r[chosen[r] == EMPTY], c] = True
            wait = _over_allowance(chosen, allowance, rng)
            grow = np.flatnonzero((chosen != EMPTY) & ~wait)
            x = chosen[grow]
            batch.add(grow, x, items.column[x])
            np.subtract.at(allowance, x, 1)
            tried[grow] = False  # a new value may anchor a cell that had none

    def _draw_paired(self, records: np.ndarray, c: int, weights: Weights, unused: np.ndarray,
                     rng: np.random.Generator) -> np.ndarray:
        """One value of column ``c`` per record, drawn with its anchor (EMPTY when none can).

        ``unused``: each item's share of its allowance still unused.
        """
        cand = np.flatnonzero(self.items.column == c)
        explained = np.where(records != EMPTY, self._dependence[c][None, :], 0.0)
        anchor = np.argmax(explained, axis=1)
        todo = np.flatnonzero(explained[np.arange(len(records)), anchor] > 0)
        w = weights.pair_counts(records[todo, anchor[todo]], cand)
        cum = np.cumsum(w * np.clip(unused[cand], 0.0, None)[None, :], axis=1)
        ok = cum[:, -1] > 0
        pick = (cum < (rng.random(len(todo)) * cum[:, -1])[:, None]).sum(axis=1)
        out = np.full(len(records), EMPTY, dtype=np.int64)
        out[todo[ok]] = cand[pick[ok]]
        return out

    # ------------------------------------------------------------------ the loop

    def _grow(self, batch: _Batch, length: int, weights: Weights, allowance: np.ndarray,
              rng: np.random.Generator, respect_allowance: bool) -> None:
        """Run the SDS loop at reporting length ``length`` until no record can grow.

        Without allowances only columns that are never empty in the data are filled.
        """
        items = self.items
        open_columns = (batch.record == EMPTY)
        if not respect_allowance:
            open_columns &= ~self.nullable[None, :]
        rows = np.flatnonzero(open_columns.any(axis=1))
        if not len(rows):
            return
        state = self._start(batch, rows, open_columns, length, weights, allowance,
                            respect_allowance)
        n = len(batch.size)
        while len(state.cand):
            within = batch.size[state.owner] + 1 <= length
            w = state.direct.copy()
            beyond = np.flatnonzero(~within)
            w[beyond] = _percentile(state.top[beyond], state.count[beyond], self.q,
                                    self.descending)
            pick, ok = _draw(state.owner, w, n, rng)
            if not ok.any():
                break
            chosen = np.where(ok, state.cand[pick], EMPTY)
            wait = _over_allowance(chosen, allowance, rng) if respect_allowance else ~ok
            grow = np.flatnonzero(ok & ~wait)
            x = chosen[grow]
            other = items.column[state.cand] != items.column[np.maximum(chosen, 0)[state.owner]]
            extend = np.flatnonzero((ok & ~wait)[state.owner] & other)
            keep = (ok & wait)[state.owner]  # records that wait keep their pairs as they are
            keep[extend[self._extend(state, extend, chosen, batch, length, weights)]] = True
            batch.add(grow, x, items.column[x])
            np.subtract.at(allowance, x, 1)
            if respect_allowance:
                keep &= allowance[state.cand] > 0
            state = state.take(keep)  # one copy a step, still sorted by record

    def _start(self, batch: _Batch, rows: np.ndarray, open_columns: np.ndarray, length: int,
               weights: Weights, allowance: np.ndarray, respect_allowance: bool) -> _Pairs:
        """Open the (record, candidate) pairs of ``rows``, dropping invalid ones.

        The state is built from every sub-combination {candidate} + T, T a subset
        of the record with |T| <= length - 1.
        """
        items = self.items
        if not respect_allowance:  # the last pass: any value, by its count
            first = np.maximum(weights.single, 1e-9)
        else:
            first = allowance if (weights.use_synthetic and weights.quotas) else weights.single
        usable = first > 0
        if respect_allowance:
            usable &= allowance > 0
        cand_mask = open_columns[rows][:, items.column] & usable[None, :]
        owner_local, cand = np.nonzero(cand_mask)
        owner = rows[owner_local]
        largest = int(batch.size[rows].max()) if len(rows) else 0
        subsets = [sub for k in range(1, min(length - 1, largest) + 1)
                   for sub in combinations(range(largest), k)]
        pad = -np.inf if self.descending else np.inf
        top = np.full((len(cand), self.keep), pad)
        top[:, 0] = first[cand]
        count = np.ones(len(cand), dtype=np.int64)
        direct = first[cand].copy()
        alive = np.ones(len(cand), dtype=bool)
        size = batch.size[owner]
        for lo in range(0, len(subsets), SUBSETS_AT_ONCE):
            group = subsets[lo:lo + SUBSETS_AT_ONCE]
            values = np.full((len(cand), len(group)), pad)
            for j, subset in enumerate(group):
                at = np.flatnonzero(alive & (size > subset[-1]))
                if not len(at):
                    continue
                value = weights.value([cand[at], *(batch.sequence[owner[at], s] for s in subset)])
                values[at, j] = value
                count[at] += 1
                alive[at] &= value > 0
                whole = size[at] == len(subset)
                direct[at[whole]] = value[whole]
            merged = np.concatenate([top, values], axis=1)
            merged = -np.sort(-merged, axis=1) if self.descending else np.sort(merged, axis=1)
            top = merged[:, :self.keep]
        return _Pairs(owner, cand, top, count, direct).take(alive)

    def _extend(self, state: _Pairs, extend: np.ndarray, chosen: np.ndarray, batch: _Batch,
                length: int, weights: Weights) -> np.ndarray:
        """Update the pairs at positions ``extend`` in place after x joins each record.

        Looks up the new sub-combinations {candidate, x} + T (T a subset of the
        record before x, |T| <= length - 2) and merges them into the pairs' state.
        Returns which of them stay alive: a candidate whose new sub-combination
        left the aggregates is dropped.
        """
        owner, cand = state.owner[extend], state.cand[extend]
        x = chosen[owner]
        size = batch.size[owner]
        largest = int(size.max()) if len(size) else 0
        subsets = [sub for s in range(0, min(length - 2, largest) + 1)
                   for sub in combinations(range(largest), s)]
        alive = np.ones(len(extend), dtype=bool)
        if not subsets:
            return alive
        pad = -np.inf if self.descending else np.inf
        columns = []
        for subset in subsets:
            member = [batch.sequence[owner, s] for s in subset]
            if subset:  # the record holds it; elsewhere the look-up reads a stray cell, unused
                holds = size > subset[-1]
                value = weights.value([cand, x, *member], complete=holds)
                columns.append(np.where(holds, value, pad))
                alive &= ~holds | (value > 0)
            else:
                value = weights.value([cand, x])
                columns.append(value)
                alive &= value > 0
            if subset == tuple(range(len(subset))):  # the whole record, when its size is that
                whole = size == len(subset)
                state.direct[extend[whole]] = value[whole]
        state.count[extend] += self._new_subsets(length)[size]
        state.top[extend] = _insert(state.top[extend], columns, self.descending)
        return alive

    def _new_subsets(self, length: int) -> np.ndarray:
        """By record size: how many sub-combinations a step adds to a pair (|T| <= length - 2)."""
        sizes = np.arange(self.items.columns + 1)
        return np.array([sum(math.comb(int(m), s) for s in range(max(length - 1, 0)))
                         for m in sizes], dtype=np.int64)
