"""Graphical-model estimation and sampling for select-measure-generate synthesizers.

A thin layer over ``mbi`` (Private-PGM, McKenna, Sheldon & Miklau 2019; Apache-2.0,
the ``synth`` extra): noisy marginals in, a Markov random field out, rows drawn
from it. Everything here is post-processing of DP measurements, so it costs no
budget. Marginals and sampling are numpy (:class:`Inference`), keyed by the
caller's generator. JAX runs in float64 inside a local ``jax.enable_x64`` context, never by a
global switch at import.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import opt_einsum
import pyarrow as pa

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError
from dpsql.synth.measure import Measurement

Clique = tuple[str, ...]


@contextlib.contextmanager
def float64() -> Iterator[Any]:
    """Import ``mbi`` and run JAX in float64 for the duration of the block."""
    try:
        import jax
    except ImportError as err:
        raise ConfigurationError("aim and mst need the synth extra: pip install 'dpsql[synth]'"
                                 ) from err
    with jax.enable_x64(True), warnings.catch_warnings():
        # mbi warns at import about float32 mode and JAX's compilation cache: neither applies
        # inside this block, and a warning must not fail a release run with -W error.
        warnings.filterwarnings("ignore", module="mbi")
        warnings.filterwarnings("ignore", message=".*donated buffers.*")
        try:
            import mbi
        except ImportError as err:
            raise ConfigurationError("aim and mst need the synth extra: "
                                     "pip install 'dpsql[synth]'") from err
        yield mbi


def mbi_domain(domain: Domain) -> Any:
    """The mbi domain of ``domain`` (same names, same sizes)."""
    from mbi import Domain as MbiDomain

    return MbiDomain(list(domain.names), list(domain.shape))


def estimate(mbi: Any, domain: Domain, measurements: Sequence[Measurement],
             total: float | None, iters: int, warm: Any = None) -> Any:
    """A Markov random field fitted to the noisy marginals by mirror descent.

    Returns its potentials and total (:class:`dpsql.synth.mirror_descent.Potentials`).
    Each measurement is weighted by its noise sd, after :func:`pooled`. ``total`` is
    the row count when the policy declares it; otherwise mbi estimates it from the
    measurements.
    """
    from dpsql.synth.mirror_descent import LeanMirrorDescent

    linear = [mbi.LinearMeasurement(values, columns, stddev=max(float(np.sqrt(variance)), 1e-9))
              for columns, values, variance in pooled(measurements)]
    return LeanMirrorDescent().estimate(
        mbi_domain(domain), linear, known_total=total, iters=iters, warm_start=warm)


def pooled(measurements: Sequence[Measurement]) -> list[tuple[Clique, np.ndarray, float]]:
    """One measurement per clique: the precision-weighted mean of its measurements.

    Returns (columns, flat values, variance per cell) in first-measured order. Noisy
    y1, y2 of one marginal with variances v1, v2 enter the weighted L2 loss exactly
    as their precision-weighted mean with variance 1 / (1/v1 + 1/v2) does (the losses
    differ by a constant), so the fit is the same; and when AIM measures a clique
    again the model's structure is unchanged, so JAX does not compile it anew.
    """
    sums: dict[Clique, tuple[np.ndarray, float]] = {}
    for m in measurements:
        precision = 1 / max(m.variance, 1e-18)
        weighted, total = sums.get(m.columns, (np.zeros(m.noisy.size), 0.0))
        sums[m.columns] = (weighted + precision * m.noisy.reshape(-1), total + precision)
    return [(columns, weighted / total, 1 / total)
            for columns, (weighted, total) in sums.items()]


def model_cells(domain: Domain, cliques: Sequence[Clique]) -> int:
    """Cells of the junction tree a model over ``cliques`` needs (public arithmetic)."""
    from mbi.junction_tree import make_junction_tree, maximal_cliques

    tree, _ = make_junction_tree(mbi_domain(domain), list(cliques))
    return sum(domain.size(tuple(c)) for c in maximal_cliques(tree))


class Inference:
    """Marginals of a fitted model, computed in numpy by variable elimination (opt_einsum).

    mbi's own JAX inference compiles anew for every clique and model structure, which
    costs seconds per call on a CPU; these models are small enough for plain contractions.
    """

    def __init__(self, model: Any, domain: Domain) -> None:
        self.domain = domain
        self.total = float(model.total)
        self.symbol = {c: opt_einsum.get_symbol(i) for i, c in enumerate(domain.names)}
        potentials = model.potentials
        self.terms = [("".join(self.symbol[c] for c in table.domain.attributes),
                       _scaled_exp(np.asarray(table.values, dtype=np.float64)))
                      for table in (potentials.tables[c] for c in potentials.cliques)]
        # every column appears, even one no measurement touches (its distribution is uniform)
        self.terms += [(self.symbol[c], np.ones(size)) for c, size in
                       zip(domain.names, domain.shape, strict=True)]

    def marginal(self, clique: Sequence[str]) -> np.ndarray:
        """The model's counts over ``clique`` (axes in the order given)."""
        spec = ",".join(s for s, _ in self.terms) + "->" + "".join(self.symbol[c] for c in clique)
        table = opt_einsum.contract(spec, *(t for _, t in self.terms), optimize="greedy")
        return np.asarray(table) / float(np.sum(table)) * self.total

    def sample(self, n: int, rng: np.random.Generator) -> pa.Table:
        """``n`` i.i.d. rows of codes, column by column along the junction tree's order."""
        from mbi.junction_tree import make_junction_tree

        cliques = [s for s, _ in self.terms if len(s) > 1]
        names = {s: c for c, s in self.symbol.items()}
        tree, order = make_junction_tree(mbi_domain(self.domain), [
            tuple(names[s] for s in clique) for clique in cliques] or [(self.domain.names[0],)])
        data: dict[str, np.ndarray] = {}
        for column in reversed(order):
            near = set().union(*(set(c) for c in tree.nodes if column in c))
            parents = [c for c in data if c in near]
            table = self.marginal([*parents, column])
            size = table.shape[-1]
            rows = (np.ravel_multi_index([data[p] for p in parents], table.shape[:-1])
                    if parents else np.zeros(n, dtype=np.int64))
            data[column] = _draw(table.reshape(-1, size), rows, rng)
        return pa.table({c: data[c].astype(np.int32) for c in self.domain.names})


def _scaled_exp(log_values: np.ndarray) -> np.ndarray:
    """The exponential of a log-potential, scaled by a constant (it cancels on normalising)."""
    return np.exp(log_values - log_values.max())


def _draw(conditional: np.ndarray, rows: np.ndarray, rng: np.random.Generator,
          chunk: int = 65_536) -> np.ndarray:
    """One value per entry of ``rows``, from the distribution in that row of ``conditional``."""
    out = np.empty(rows.size, dtype=np.int64)
    size = conditional.shape[1]
    for start in range(0, rows.size, chunk):
        cumulative = np.cumsum(conditional[rows[start:start + chunk]], axis=1)
        cumulative[cumulative[:, -1] <= 0] = np.arange(1, size + 1)  # no mass: uniform
        u = rng.random((cumulative.shape[0], 1)) * cumulative[:, -1:]
        out[start:start + chunk] = np.minimum((cumulative <= u).sum(axis=1), size - 1)
    return out
