"""``mst`` (McKenna, Miklau & Sheldon, "Winning the NIST Contest", JPC 2021).

AIM's cheap sibling: 1-way marginals, then a maximum spanning tree of 2-way
marginals chosen pair by pair with the exponential mechanism, measured once;
Private-PGM fits the model (:mod:`dpsql.synth.pgm`). Selection, noise and
accounting are dpsql's, shared with ``aim`` (:mod:`dpsql.synth.aim`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import duckdb
import numpy as np

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError
from dpsql.mechanisms.additive import additive
from dpsql.mechanisms.exponential import ExponentialMechanism
from dpsql.privacy import PrivacyCost
from dpsql.progress import Progress, silent
from dpsql.synth import pgm
from dpsql.synth.aim import Clique, FittedPGM, ModelFit, SelectMeasureGenerate
from dpsql.synth.forecast import Forecast, Planned, baseline, expected_l1, noise_sd
from dpsql.synth.spanning import grow, spanning_forest


def spanning_edges(names: Sequence[str], pairs: Sequence[Clique]) -> int:
    """Edges of a spanning forest of the graph ``pairs`` (public arithmetic)."""
    return len(spanning_forest(names, [(a, b) for a, b in pairs]))


@dataclass
class MST(SelectMeasureGenerate):
    """A maximum spanning tree of 2-way marginals, chosen privately, then Private-PGM.

    Options: ``oneway_share`` and ``select_share`` (budget shares of the 1-way
    marginals and of the tree's selection, a third each; the 2-way marginals get
    the rest), ``max_cells`` (pairs larger than max_cells / (columns - 1) are not
    candidates, so the tree fits), ``iters`` (mirror-descent iterations).
    Unlike the NIST-contest code, rare values are not merged before selection.

    Privacy: zCDP. 1-way and 2-way marginals are discrete Gaussians on counts (L2
    sensitivity max_rows); each of the columns - 1 tree edges is an exponential
    mechanism over the pairs joining two components, scored by the integer L1
    error of the 1-way model on the pair (sensitivity max_rows), (epsilon^2 / 8)-zCDP.
    Parts are named shares of the budget and sum to it (less rounding, never more).
    McKenna, Miklau & Sheldon, JPC 2021.
    """

    name: ClassVar[str] = "mst"
    is_dp: ClassVar[bool] = True
    oneway_share: float = 1 / 3
    select_share: float = 1 / 3

    def __post_init__(self) -> None:
        self._check_options()
        if min(self.oneway_share, self.select_share) <= 0 or \
                self.oneway_share + self.select_share >= 1:
            raise ConfigurationError("oneway_share and select_share must be positive with a "
                                     "sum below 1 (the 2-way marginals get the rest)")

    def _pairs(self, domain: Domain) -> list[Clique]:
        limit = self.max_cells // max(1, len(domain.names) - 1)
        return [p for p in itertools.combinations(domain.names, 2) if domain.size(p) <= limit]

    def check(self, domain: Domain, budget: PrivacyCost) -> None:
        """Refuse what fit would refuse, before the release charges the budget."""
        self._check_budget("mst", domain, budget)
        edges = spanning_edges(domain.names, self._pairs(domain))
        oneway_budget = self._parts(budget)[0] if edges else budget
        additive("zcdp", domain.max_rows, oneway_budget.split([1] * len(domain.names))[0])
        if edges:
            _, select_budget, pair_budget = self._parts(budget)
            ExponentialMechanism.calibrate(domain.max_rows, select_budget.split([1] * edges)[0])
            additive("zcdp", domain.max_rows, pair_budget.split([1] * edges)[0])

    def _parts(self, budget: PrivacyCost) -> list[PrivacyCost]:
        """The budget of the 1-way marginals, of the selection and of the 2-way marginals."""
        return budget.split([self.oneway_share, self.select_share,
                             1 - self.oneway_share - self.select_share])

    def forecast(self, domain: Domain, budget: PrivacyCost) -> Forecast:
        """The 1-way marginals, then the 2-way marginals of a spanning tree of pairs."""
        columns = len(domain.names)
        pairs = self._pairs(domain)
        edges = spanning_edges(domain.names, pairs)
        oneway_budget = self._parts(budget)[0] if edges else budget
        sd, mechanism = noise_sd(oneway_budget.split([1] * columns)[0], domain.max_rows)
        planned = [Planned("1-way marginal of each column", columns, max(domain.shape),
                           mechanism, sd)]
        if edges:
            pair_budget = self._parts(budget)[2]
            pair_sd, _ = noise_sd(pair_budget.split([1] * edges)[0], domain.max_rows)
            widest = max(domain.size(p) for p in pairs)
            planned.append(Planned("2-way marginal of a spanning tree of pairs", edges, widest,
                                   mechanism, pair_sd))
        errors = [expected_l1(sd, mechanism, n) for n in domain.shape]
        return Forecast(self.name, tuple(planned), domain.public_rows, baseline(domain, budget),
                        oneway=sum(errors) / columns)

    def fit(self, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
            rng: np.random.Generator, progress: Progress | None = None) -> FittedPGM:
        """Measure the 1-ways, choose a tree of pairs, measure them, fit the model."""
        report = progress or silent
        self.check(domain, budget)
        oneway = [(c,) for c in domain.names]
        pairs = self._pairs(domain)
        edges = spanning_edges(domain.names, pairs)
        if edges:
            oneway_budget, select_budget, pair_budget = self._parts(budget)
        else:  # one column, or no pair fits: the 1-ways get everything
            oneway_budget = budget
        log: list[dict[str, Any]] = []
        with pgm.float64() as mbi:
            fit = ModelFit.count(mbi, source, domain, oneway + pairs, self.iters)
            for clique, cost in zip(oneway, oneway_budget.split([1] * len(oneway)), strict=True):
                fit.measure(clique, cost)
            report("select", 0, edges)
            if edges:
                fit.refit(self.iters)
                mechanism = ExponentialMechanism.calibrate(
                    domain.max_rows, select_budget.split([1] * edges)[0])
                errors = {p: fit.error(p) for p in pairs}

                def choose(live: list[tuple[str, str]]) -> tuple[str, str]:
                    pick = live[fit.select(mechanism, [errors[p] for p in live])]
                    log.append({"pair": list(pick), "candidates": len(live),
                                "epsilon": float(mechanism.epsilon)})
                    report("select", len(log), edges)
                    return pick

                chosen = grow(domain.names, [(a, b) for a, b in pairs], choose, rounds=edges)
                for pair, cost in zip(chosen, pair_budget.split([1] * edges), strict=True):
                    fit.measure(pair, cost)
            report("estimate", 0, 1)
            fitted = fit.fitted({"oneway_share": self.oneway_share,
                                 "select_share": self.select_share,
                                 "max_cells": self.max_cells, "iters": self.iters},
                                {"tree": log})
            report("estimate", 1, 1)
        return fitted
