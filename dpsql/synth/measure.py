"""Noisy marginals from DuckDB in one pass (GROUPING SETS) over the bounded source.

Privacy: a marginal is a vector of counts over the full public domain (empty
cells included, so the set of cells leaks nothing). One privacy unit changes
each marginal by at most ``max_rows`` in L1 and in L2, so k marginals together
have L1 sensitivity k * max_rows and L2 sensitivity sqrt(k) * max_rows. Each
marginal gets the policy's additive noise with its share
(:func:`dpsql.mechanisms.additive.additive`, the mechanism SQL counts get):
discrete Laplace with its share of epsilon under pure accounting, discrete
Gaussian with its share of rho under zCDP. Shares sum to at most the budget
(parts round down), so the total cost never exceeds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from dpsql.domain import Domain, quote
from dpsql.errors import ConfigurationError
from dpsql.mechanisms.additive import additive
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.privacy import Number, PrivacyCost

MAX_CELLS = 50_000_000  # a dense marginal larger than this is refused, not allocated


@dataclass(frozen=True)
class Measurement:
    """A noisy marginal: counts shaped like the domain of ``columns``."""

    columns: tuple[str, ...]
    noisy: np.ndarray = field(repr=False)
    mechanism: str
    scale: float  # Laplace scale, or Gaussian sigma
    cost: PrivacyCost

    @property
    def variance(self) -> float:
        """Noise variance per cell (for weighting measurements in inference)."""
        if self.mechanism == LaplaceMechanism.name:
            return 2 * self.scale**2
        return self.scale**2

    def describe(self) -> dict[str, Any]:
        """JSON-able descriptor (no counts): what was measured, how, at what cost."""
        return {"columns": list(self.columns), "cells": int(self.noisy.size),
                "mechanism": self.mechanism, "scale": self.scale, "cost": self.cost.as_dict()}


def count_marginals(source: duckdb.DuckDBPyRelation, domain: Domain,
                    marginals: Sequence[Sequence[str]]) -> list[np.ndarray]:
    """Exact counts of each marginal over the full domain, in one DuckDB pass.

    Rows whose code is NULL (outside the public domain) in a marginal's columns
    count in no cell of it. These counts are private: only noise makes them DP.
    """
    sets = [tuple(m) for m in marginals]
    for m in sets:
        if domain.size(m) > MAX_CELLS:
            raise ConfigurationError(
                f"the marginal over {', '.join(m)} has {domain.size(m):,} cells, too many to "
                "measure; choose fewer or coarser columns (bins in the policy)")
    used = sorted({c for m in sets for c in m}, key=domain.names.index)
    cols = ", ".join(quote(c) for c in used)
    encoded = domain.project(used).encode_sql("_bounded") if used else "SELECT 1 FROM _bounded"
    grouping = ", ".join("(" + ", ".join(quote(c) for c in m) + ")" for m in sets)
    gid = f"GROUPING({cols})" if used else "0"
    sql = (f"WITH _bounded AS (SELECT * FROM _dpsql_source), _enc AS ({encoded}) "
           f"SELECT {cols + ', ' if used else ''}{gid} AS _gid, count(*) AS _n "
           f"FROM _enc GROUP BY GROUPING SETS ({grouping})")
    result = source.query("_dpsql_source", sql)
    assert result is not None
    table = result.fetchnumpy()
    gids = np.asarray(table["_gid"], dtype=np.int64)
    counts = np.asarray(table["_n"], dtype=np.int64)
    out = []
    for m in sets:
        # GROUPING() sets bit (len(used)-1-i) when column i is NOT grouped.
        expected = sum(1 << (len(used) - 1 - i) for i, c in enumerate(used) if c not in m)
        rows = gids == expected
        shape = domain.project(m).shape if m else ()
        dense = np.zeros(shape, dtype=np.int64)
        if not m:
            dense[()] = counts[rows].sum()
            out.append(dense)
            continue
        keys = [np.asarray(_filled(table[c], rows)) for c in m]
        valid = np.all([k >= 0 for k in keys], axis=0)
        np.add.at(dense, tuple(k[valid] for k in keys), counts[rows][valid])
        out.append(dense)
    return out


def _filled(column: Any, rows: np.ndarray) -> np.ndarray:
    values = np.ma.filled(np.ma.asarray(column)[rows].astype(np.float64), -1)
    return np.asarray(values, dtype=np.int64)


def measure_marginals(source: duckdb.DuckDBPyRelation, domain: Domain,
                      marginals: Sequence[Sequence[str]], budget: PrivacyCost,
                      shares: Sequence[Number] | None = None) -> list[Measurement]:
    """Noisy counts for ``marginals`` within ``budget`` (split by ``shares``, default equal).

    Privacy: see the module docstring; the returned costs sum to at most ``budget``.
    """
    if not marginals:
        return []
    parts = budget.split(list(shares) if shares is not None else [1] * len(marginals))
    exact = count_marginals(source, domain, marginals)
    return [
        measure_counts(tuple(m), counts, part, domain.max_rows)
        for m, counts, part in zip(marginals, exact, parts, strict=True)
    ]


def measure_counts(columns: tuple[str, ...], counts: np.ndarray, cost: PrivacyCost,
                   sensitivity: int) -> Measurement:
    """Noise one vector of exact counts whose L1 and L2 sensitivity is ``sensitivity``.

    Privacy: discrete Laplace (pure) or discrete Gaussian (zCDP) calibrated to
    ``cost`` (:func:`dpsql.mechanisms.additive.additive`); the returned
    measurement's cost, the loss at the parameter sampled, is at most ``cost``.
    """
    mechanism = additive(cost.kind, sensitivity, cost)
    if mechanism.param == 0:
        return Measurement(columns, counts.copy(), mechanism.name, 0.0, cost)
    noisy = mechanism.release(counts.reshape(-1))
    return Measurement(columns, noisy.reshape(counts.shape), mechanism.name,
                       mechanism.noise_scale, mechanism.cost(cost.kind))
