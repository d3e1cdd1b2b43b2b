"""Empirical privacy diagnostics of MODP (Press 2024, sec. 6), for the non-DP mode.

- entropy: bits of randomness in each synthetic row's draws (a row is one of
  about 2^bits equally likely rows);
- multiplicity: how many true rows are identical to each true row;
- effective multiplicity: their product, multiplicity * 2^bits;
- Hamming rank: for a sample of synthetic rows, how many true rows are as close
  or closer (in number of differing columns) than the true row it came from,
  counting that row; rank 1 means the causal row is the unique nearest.

These are statistics of the real rows: they describe an empirical release and
are never DP.
"""

from __future__ import annotations

from typing import Any

import numpy as np

QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


def summary(values: np.ndarray, digits: int = 4) -> dict[str, Any]:
    """Mean and quantiles of ``values`` (JSON-able)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return {"count": 0}
    qs = np.quantile(values, QUANTILES)
    return {"count": int(values.size), "mean": round(float(values.mean()), digits),
            "quantiles": {f"{q:g}": round(float(v), digits)
                          for q, v in zip(QUANTILES, qs, strict=True)}}


def multiplicity(codes: np.ndarray) -> np.ndarray:
    """For each row, the number of rows identical to it (itself included)."""
    if len(codes) == 0:
        return np.zeros(0, dtype=np.int64)
    _, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    return np.asarray(counts[inverse.reshape(-1)], dtype=np.int64)


def hamming_ranks(true_codes: np.ndarray, synthetic: np.ndarray, sources: np.ndarray,
                  chunk: int = 64) -> np.ndarray:
    """For each synthetic row, how many true rows are as close as its source, or closer.

    Hamming distance (differing columns); the source itself counts, so 1 means
    the source is the unique nearest true row.
    """
    ranks = np.empty(len(synthetic), dtype=np.int64)
    for start in range(0, len(synthetic), chunk):
        rows = synthetic[start:start + chunk]
        distance = (rows[:, None, :] != true_codes[None, :, :]).sum(axis=2)
        own = distance[np.arange(len(rows)), sources[start:start + chunk]]
        ranks[start:start + chunk] = (distance <= own[:, None]).sum(axis=1)
    return ranks


def report(true_codes: np.ndarray, synthetic: np.ndarray, entropy_bits: np.ndarray,
           sample: np.ndarray) -> dict[str, Any]:
    """The section-6 diagnostics for one synthetic instance of every true row.

    ``synthetic[i]`` comes from ``true_codes[i]``; Hamming ranks are computed
    for the rows ``sample``.
    """
    mult = multiplicity(true_codes)
    bits = np.asarray(entropy_bits, dtype=np.float64)
    effective = np.log10(mult) + bits * np.log10(2)
    ranks = hamming_ranks(true_codes, synthetic[sample], sample)
    histogram, edges = np.histogram(bits, bins=np.arange(0, np.ceil(bits.max(initial=0)) + 2))
    return {
        "entropy_bits": {**summary(bits), "histogram": {
            "edges": [int(e) for e in edges], "counts": [int(c) for c in histogram]}},
        "multiplicity": {**summary(mult), "fraction_unique": round(float(np.mean(mult == 1)), 4)
                         if len(mult) else None},
        "log10_effective_multiplicity": summary(effective),
        "hamming_rank": {
            **summary(ranks), "rows": len(sample),
            "fraction_nearest": round(float(np.mean(ranks == 1)), 4) if len(ranks) else None,
            "fraction_within_10": round(float(np.mean(ranks <= 10)), 4) if len(ranks) else None,
        },
    }
