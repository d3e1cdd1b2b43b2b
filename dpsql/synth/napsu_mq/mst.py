"""MST marginal selection (McKenna, Miklau & Sheldon 2021), made exact and reusable.

1. Measure every 1-way marginal with discrete Gaussian noise (its share of rho).
2. Score each pair of columns by how badly the independence model built from
   the noisy 1-ways predicts the pair's true 2-way table: the L1 distance
   between the counts and the (public, rounded) prediction.
3. Starting from the components the required cliques already join, add
   ``components - 1`` pairs, Kruskal style: each round the exponential mechanism
   picks one pair among those joining two components whose parameters still fit
   in ``room`` (public: the pair's domain sizes); when none fits, selection
   stops with a forest and the remaining rounds' share is not spent.

Privacy: the 1-way marginals cost their share (see
:func:`dpsql.synth.measure.measure_marginals`). A score is an integer L1
distance from a public table, so adding or removing one privacy unit moves it
by at most ``max_rows``. Each round is an exponential mechanism with an equal
share of the selection budget, (epsilon^2 / 8)-zCDP, composed adaptively. The
noisy 1-way marginals are kept and used as evidence by the model (no extra cost).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from dpsql.domain import Domain
from dpsql.mechanisms.exponential import ExponentialMechanism
from dpsql.privacy import PrivacyCost
from dpsql.synth.measure import Measurement, count_marginals, measure_marginals
from dpsql.synth.spanning import components, grow


@dataclass(frozen=True)
class Selection:
    """What MST chose and what it measured on the way."""

    pairs: tuple[tuple[str, str], ...]
    oneway: tuple[Measurement, ...]
    rounds: tuple[dict[str, Any], ...]
    spent: PrivacyCost
    stopped: str = ""  # why selection ended before a spanning tree, if it did

    def describe(self) -> dict[str, Any]:
        """JSON-able record for the provenance (no private values)."""
        return {"method": "mst", "pairs": [list(p) for p in self.pairs],
                "oneway": [m.describe() for m in self.oneway], "rounds": list(self.rounds),
                "cost": self.spent.as_dict(), "stopped": self.stopped}


def independent_prediction(oneway: Sequence[Measurement]) -> tuple[dict[str, np.ndarray], float]:
    """Per column, the probabilities the noisy 1-way counts suggest, and the row estimate."""
    probs = {}
    totals = []
    for m in oneway:
        counts = np.clip(m.noisy.astype(np.float64), 0, None)
        total = counts.sum()
        size = counts.size
        probs[m.columns[0]] = counts / total if total > 0 else np.full(size, 1 / size)
        totals.append(float(m.noisy.sum()))
    return probs, max(float(np.mean(totals)), 1.0)


def select(source: duckdb.DuckDBPyRelation, domain: Domain, required: Sequence[Sequence[str]],
           oneway_budget: PrivacyCost, select_budget: PrivacyCost,
           room: float = float("inf")) -> Selection:
    """Run MST selection on top of the ``required`` cliques, adding at most ``room`` parameters.

    A pair joining two components adds (k_a - 1)(k_b - 1) canonical parameters
    to a model holding every 1-way marginal.
    """
    names = list(domain.names)
    oneway = measure_marginals(source, domain, [(c,) for c in names], oneway_budget)
    spent = sum((m.cost for m in oneway), PrivacyCost.zero("zcdp"))
    groups = components(names, required)
    rounds = len(set(groups.values())) - 1
    if rounds == 0:
        return Selection((), tuple(oneway), (), spent)
    probs, rows = independent_prediction(oneway)
    candidates = [(a, b) for a, b in itertools.combinations(names, 2) if groups[a] != groups[b]]
    exact = count_marginals(source, domain, candidates)
    scores = []
    for (a, b), counts in zip(candidates, exact, strict=True):
        predicted = np.rint(rows * np.outer(probs[a], probs[b])).astype(np.int64)
        scores.append(int(np.abs(counts - predicted).sum()))
    del exact
    per_round = select_budget.split([1] * rounds)[0]
    mechanism = ExponentialMechanism.calibrate(domain.max_rows, per_round)
    sizes = dict(zip(names, domain.shape, strict=True))
    added = {(a, b): (sizes[a] - 1) * (sizes[b] - 1) for a, b in candidates}
    score = dict(zip(candidates, scores, strict=True))
    log: list[dict[str, Any]] = []

    def choose(live: list[tuple[str, str]]) -> tuple[str, str]:
        nonlocal room, spent
        pick = live[mechanism.select(np.asarray([score[p] for p in live], dtype=np.int64))]
        room -= added[pick]
        spent = spent + mechanism.cost("zcdp")
        log.append({"pair": list(pick), "candidates": len(live),
                    "epsilon": float(mechanism.epsilon), "cost": mechanism.cost().as_dict()})
        return pick

    chosen = grow(names, candidates, choose, joined=required, rounds=rounds,
                  fits=lambda pair: added[pair] <= room)
    stopped = "" if len(chosen) == rounds else (
        f"after {len(chosen)} of {rounds} rounds: no pair joining two components fits in "
        "max_parameters")
    return Selection(tuple(chosen), tuple(oneway), tuple(log), spent, stopped)
