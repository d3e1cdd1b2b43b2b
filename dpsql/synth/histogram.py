"""DP histogram synthesizers (Programming Differential Privacy, ch. 14).

- ``independent``: a noisy 1-way marginal per column, sampled column by column
  (keeps each column's distribution, loses every correlation);
- ``joint``: one noisy n-way marginal over the chosen columns, sampled as tuples
  (keeps all correlations, but noise grows with the number of cells).

Both measure the full public domain in one DuckDB pass (see
:mod:`dpsql.synth.measure`), turn noisy counts into probabilities by clipping
negatives (the book's method) or by projecting onto the simplex, and estimate
the row count from a small noisy count combined with the marginals' sums
(unless the policy makes the row count public). The range-query tree lives in
:mod:`dpsql.synth.range_tree`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError, ReleaseError
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.privacy import PrivacyCost, to_fraction
from dpsql.progress import Progress, silent
from dpsql.synth.forecast import (
    Forecast,
    Planned,
    baseline,
    histogram_shares,
    noise_sd,
    oneway_plan,
)
from dpsql.synth.measure import MAX_CELLS, Measurement, measure_marginals

POSTPROCESS = ("clip", "project")


# -- post-processing (free: it only reads DP measurements) -----------------------------


def project_simplex(values: np.ndarray, total: float) -> np.ndarray:
    """The Euclidean projection of ``values`` onto {p >= 0, sum p = total} (Duchi et al. 2008).

    Unlike clipping, it also pulls down the cells that noise pushed above zero,
    so empty cells of a sparse table do not soak up mass.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if total <= 0:
        return np.zeros_like(x)
    u = np.sort(x)[::-1]
    excess = np.cumsum(u) - total
    k = np.arange(1, x.size + 1)
    last = np.nonzero(u - excess / k > 0)[0][-1]
    theta = excess[last] / (last + 1)
    return np.maximum(x - theta, 0.0)


def probabilities(noisy: np.ndarray, method: str, total: float) -> np.ndarray:
    """Noisy counts -> a probability table of the same shape (uniform if nothing is left)."""
    x = np.asarray(noisy, dtype=np.float64)
    kept = np.clip(x, 0, None) if method == "clip" else project_simplex(x, total).reshape(x.shape)
    mass = kept.sum()
    if mass <= 0:
        return np.full(x.shape, 1.0 / x.size)
    return kept / mass


def expected_phantom_mass(measurement_sd: float, mechanism: str, cells: int) -> float:
    """Expected mass that clipped noise adds to ``cells`` empty cells (E[max(noise, 0)] each)."""
    if mechanism == LaplaceMechanism.name:
        per_cell = measurement_sd / (2 * math.sqrt(2))  # Laplace scale b = sd / sqrt(2): b / 2
    else:
        per_cell = measurement_sd / math.sqrt(2 * math.pi)
    return cells * per_cell


def combine_row_estimates(estimates: Sequence[tuple[float, float]]) -> float:
    """Inverse-variance average of (estimate, variance) pairs; exact ones (variance 0) win."""
    exact = [e for e, v in estimates if v == 0]
    if exact:
        return float(exact[0])
    weights = [1 / v for _, v in estimates]
    return float(sum(w * e for w, (e, _) in zip(weights, estimates, strict=True)) / sum(weights))


# -- the fitted model -----------------------------------------------------------------------


@dataclass
class FittedHistogram:
    """Noisy marginals that partition the columns; each is sampled independently.

    Everything it holds is DP (noisy counts, and what post-processing made of them).
    """

    method: str
    domain: Domain
    marginals: tuple[tuple[str, ...], ...]
    noisy: tuple[np.ndarray, ...]
    rows: int
    spent: PrivacyCost
    postprocess: str
    measurements: list[dict[str, Any]]
    parameters: dict[str, Any]
    diagnostics: dict[str, Any]
    tables: tuple[np.ndarray, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.tables = tuple(probabilities(n, self.postprocess, self.rows) for n in self.noisy)

    def sample(self, n: int, rng: np.random.Generator) -> pa.Table:
        """``n`` rows of codes: each marginal drawn as tuples, marginals independently."""
        columns: dict[str, np.ndarray] = {}
        for names, table in zip(self.marginals, self.tables, strict=True):
            flat = rng.choice(table.size, size=n, p=table.ravel())
            for name, codes in zip(names, np.unravel_index(flat, table.shape), strict=True):
                columns[name] = codes.astype(np.int32)
        return pa.table({name: columns[name] for name in self.domain.names})

    def describe(self) -> dict[str, Any]:
        """Parameters, measurement descriptors (no counts) and diagnostics."""
        return {"parameters": self.parameters, "measurements": self.measurements,
                "diagnostics": self.diagnostics}

    def state(self) -> dict[str, Any]:
        """The noisy counts (DP) and what is needed to sample from them again."""
        return {
            "method": self.method,
            "marginals": [list(m) for m in self.marginals],
            "noisy": [n.ravel().tolist() for n in self.noisy],
            "rows": self.rows,
            "spent": {"kind": self.spent.kind, "units": str(self.spent.units),
                      "infinite": self.spent.infinite},
            "postprocess": self.postprocess,
            "measurements": self.measurements,
            "parameters": self.parameters,
            "diagnostics": self.diagnostics,
        }


def restore_histogram(state: dict[str, Any], domain: Domain) -> FittedHistogram:
    """Rebuild a :class:`FittedHistogram` from :meth:`FittedHistogram.state` (no new noise)."""
    try:
        marginals = tuple(tuple(m) for m in state["marginals"])
        noisy = tuple(np.asarray(values, dtype=np.int64).reshape(domain.project(m).shape)
                      for m, values in zip(marginals, state["noisy"], strict=True))
        spent = state["spent"]
        return FittedHistogram(
            method=state["method"], domain=domain, marginals=marginals, noisy=noisy,
            rows=int(state["rows"]),
            spent=PrivacyCost(spent["kind"], int(spent["units"]), bool(spent["infinite"])),
            postprocess=state["postprocess"], measurements=state["measurements"],
            parameters=state["parameters"], diagnostics=state["diagnostics"],
        )
    except (KeyError, ValueError, TypeError, ConfigurationError) as err:
        raise ReleaseError("the stored state does not fit this release's domain (was the "
                           "policy's domain changed?); release again instead") from err


# -- fitting ----------------------------------------------------------------------------------


def fit_histogram(method: str, marginals: Sequence[tuple[str, ...]],
                  source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
                  count_share: float, postprocess: str, progress: Progress | None,
                  parameters: dict[str, Any]) -> FittedHistogram:
    """Measure ``marginals`` (and a row count unless it is public) within ``budget``.

    Privacy: k marginals plus the count, each a partition of the bounded rows
    (sensitivity max_rows), composed sequentially with the budget split by
    shares; see :func:`dpsql.synth.measure.measure_marginals`.
    """
    report = progress or silent
    share = to_fraction(count_share, "count_share")
    with_count = domain.public_rows is None and share > 0
    sets: list[tuple[str, ...]] = [tuple(m) for m in marginals] + ([()] if with_count else [])
    report("measure", 0, 1)
    measured = measure_marginals(source, domain, sets, budget,
                                 histogram_shares(len(marginals), share, with_count))
    report("measure", 1, 1)
    spent = measured[0].cost
    for m in measured[1:]:
        spent = spent + m.cost
    counts = measured[:len(marginals)]
    rows, row_info = _row_count(domain, counts, measured[-1] if with_count else None)
    diagnostics = _diagnostics(counts, rows)
    diagnostics["row_count"] = row_info
    return FittedHistogram(
        method=method, domain=domain, marginals=tuple(tuple(m) for m in marginals),
        noisy=tuple(m.noisy for m in counts), rows=rows, spent=spent, postprocess=postprocess,
        measurements=[m.describe() for m in measured], parameters=parameters,
        diagnostics=diagnostics,
    )


def _row_count(domain: Domain, marginals: Sequence[Measurement],
               count: Measurement | None) -> tuple[int, dict[str, Any]]:
    """The row count the policy declares, or a DP estimate from the noisy count and marginals."""
    if domain.public_rows is not None:
        return domain.public_rows, {"source": "declared", "rows": domain.public_rows}
    estimates = [(float(m.noisy.sum()), m.variance * m.noisy.size) for m in marginals]
    if count is not None:
        estimates.append((float(count.noisy.sum()), count.variance))
    rows = max(1, round(combine_row_estimates(estimates)))
    return rows, {"source": "dp", "estimate": rows,
                  "combined": "inverse-variance average of the noisy count and marginal sums"}


def _diagnostics(marginals: Sequence[Measurement], rows: int) -> dict[str, Any]:
    """Noise diagnostics (DP: noise scales, cell counts and the DP row estimate only)."""
    warnings = []
    per_marginal = []
    for m in marginals:
        sd = math.sqrt(m.variance)
        mass = expected_phantom_mass(sd, m.mechanism, m.noisy.size)
        per_marginal.append({"columns": list(m.columns), "cells": int(m.noisy.size),
                             "noise_sd": sd, "expected_noise_mass": mass})
        if mass > 0.5 * rows:
            warnings.append(
                f"the marginal over {', '.join(m.columns)} has {m.noisy.size:,} cells; its noise "
                f"adds about {mass:,.0f} phantom rows to about {rows:,} rows, so it is mostly "
                "noise: use fewer or coarser columns, a larger budget, or postprocess=project")
    return {"marginals": per_marginal, "warnings": warnings}


@dataclass
class _HistogramOptions:
    """Options shared by the histogram synthesizers."""

    count_share: float = 0.05
    postprocess: str = "clip"

    def _check_options(self) -> None:
        if not 0 <= self.count_share < 1:
            raise ConfigurationError(f"count_share must be in [0, 1), got {self.count_share}")
        if self.postprocess not in POSTPROCESS:
            raise ConfigurationError(f"postprocess must be one of {', '.join(POSTPROCESS)}, "
                                     f"got {self.postprocess!r}")

    def restore(self, state: dict[str, Any], domain: Domain) -> FittedHistogram:
        """A fitted model from a stored state (for more copies at no privacy cost)."""
        return restore_histogram(state, domain)


@dataclass
class Independent(_HistogramOptions):
    """One noisy 1-way marginal per column; columns are sampled independently.

    Options: ``count_share`` (budget share of the noisy row count, 0 to derive it
    from the marginals alone), ``postprocess`` (``clip`` negatives as in the book,
    or ``project`` onto the simplex).

    Privacy: each marginal partitions the bounded rows (L1 and L2 sensitivity
    max_rows: parallel composition within a column); k marginals and the count
    compose sequentially. Laplace under pure DP, Gaussian under zCDP; total cost
    at most the budget. Near, Programming Differential Privacy, ch. 14.
    """

    name: ClassVar[str] = "independent"
    is_dp: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self._check_options()

    def forecast(self, domain: Domain, budget: PrivacyCost) -> Forecast:
        """Its 1-way marginals' noise: the yardstick of every other forecast."""
        planned, error = oneway_plan(domain, budget, self.count_share)
        return Forecast(self.name, (planned,), domain.public_rows, error, error)

    def fit(self, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
            rng: np.random.Generator, progress: Progress | None = None) -> FittedHistogram:
        """Measure every column's 1-way marginal (and the row count) within ``budget``."""
        return fit_histogram("independent", [(n,) for n in domain.names], source, domain, budget,
                             self.count_share, self.postprocess, progress,
                             {"count_share": self.count_share, "postprocess": self.postprocess})


@dataclass
class Joint(_HistogramOptions):
    """One noisy n-way marginal over all chosen columns, sampled as whole tuples.

    Options as ``independent``, but ``postprocess`` defaults to ``project``:
    in a sparse joint table clipping leaves the positive noise of every empty
    cell (the benchmark shows about half the workload error with projection).
    Refuses, before any budget is spent, a joint table too large to be useful:
    more than ``max_cells`` cells, or (when the row count is public or the
    admin states ``expected_rows``) noise expected to add more phantom rows than
    ``max_noise_ratio`` times the rows. Otherwise a warning in the diagnostics
    says so after the fit, from the DP row estimate.

    Privacy: the joint table partitions the bounded rows (sensitivity
    max_rows); with the row count, two measurements compose sequentially.
    Laplace under pure DP, Gaussian under zCDP. Near, Programming Differential
    Privacy, ch. 14.
    """

    name: ClassVar[str] = "joint"
    is_dp: ClassVar[bool] = True
    postprocess: str = "project"  # clipping lets empty cells soak up mass in sparse tables
    max_cells: int = 1_000_000
    expected_rows: int | None = None
    max_noise_ratio: float = 1.0

    def __post_init__(self) -> None:
        self._check_options()
        if self.max_cells < 1 or self.max_noise_ratio <= 0:
            raise ConfigurationError("max_cells and max_noise_ratio must be positive")
        if self.expected_rows is not None and self.expected_rows < 1:
            raise ConfigurationError("expected_rows must be a positive number of rows")

    def check(self, domain: Domain, budget: PrivacyCost) -> None:
        """Refuse a hopeless joint table from public information only (no budget spent)."""
        cells = domain.size()
        fewer = "release fewer columns (--columns), coarser bins in the policy"
        advice = f"{fewer}, a larger budget, or use the independent synthesizer"
        limit = min(self.max_cells, MAX_CELLS)
        if cells > limit:  # the number of cells does not depend on the budget
            raise ReleaseError(f"the joint table over {', '.join(domain.names)} has {cells:,} "
                               f"cells, more than {limit:,} (max_cells, and at most "
                               f"{MAX_CELLS:,} can be measured); {fewer}, or use the "
                               "independent synthesizer")
        reference = domain.public_rows or self.expected_rows
        if reference is None or budget.infinite:
            return
        share = to_fraction(self.count_share, "count_share")
        part = budget.split(histogram_shares(1, share, domain.public_rows is None and share > 0))[0]
        sd, mechanism = noise_sd(part, domain.max_rows)
        mass = expected_phantom_mass(sd, mechanism, cells)
        if mass > self.max_noise_ratio * reference:
            raise ReleaseError(
                f"at this budget the joint table's noise (sd {sd:.3g} per cell over {cells:,} "
                f"cells) would add about {mass:,.0f} phantom rows to {reference:,} rows; "
                f"{advice}")

    def forecast(self, domain: Domain, budget: PrivacyCost) -> Forecast:
        """One marginal over every chosen column; its noise spreads over all its cells."""
        share = to_fraction(self.count_share, "count_share")
        part = budget.split(histogram_shares(1, share, domain.public_rows is None and share > 0))[0]
        sd, mechanism = noise_sd(part, domain.max_rows)
        planned = Planned(f"joint marginal of {len(domain.names)} columns", 1, domain.size(),
                          mechanism, sd)
        return Forecast(self.name, (planned,), domain.public_rows, baseline(domain, budget))

    def fit(self, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
            rng: np.random.Generator, progress: Progress | None = None) -> FittedHistogram:
        """Measure the joint marginal (and the row count) within ``budget``."""
        self.check(domain, budget)
        parameters = {"count_share": self.count_share, "postprocess": self.postprocess,
                      "max_cells": self.max_cells, "expected_rows": self.expected_rows,
                      "max_noise_ratio": self.max_noise_ratio}
        return fit_histogram("joint", [domain.names], source, domain, budget, self.count_share,
                             self.postprocess, progress, parameters)
