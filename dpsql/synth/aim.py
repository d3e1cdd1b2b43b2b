"""AIM and MST: select marginals under the budget, measure them, fit a graphical model.

- ``aim`` (McKenna, Mullins, Sheldon & Miklau, "AIM: An Adaptive and Iterative
  Mechanism for Differentially Private Synthetic Data", VLDB 2022): measure every
  1-way marginal, then round after round pick the candidate marginals the current
  model gets most wrong for the workload (exponential mechanism; the paper picks
  one a round, dpsql three by default, ``per_round``), measure them with Gaussian
  noise and refit; when a round barely changes the model, the next rounds get
  four times the budget (annealing); the last round spends what is left.
- ``mst`` (McKenna, Miklau & Sheldon, "Winning the NIST Contest", JPC 2021): the
  cheap sibling: 1-way marginals, then a maximum spanning tree of 2-way marginals
  chosen pair by pair with the exponential mechanism, measured once.

Selection, noise and accounting are dpsql's (exact samplers, exact costs); the
graphical model is Private-PGM's (:mod:`dpsql.synth.pgm`, the ``synth`` extra).
The private counts of every candidate marginal are computed in one DuckDB pass.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError, ReleaseError
from dpsql.mechanisms.additive import additive
from dpsql.mechanisms.exponential import ExponentialMechanism
from dpsql.mechanisms.gaussian import GaussianMechanism
from dpsql.privacy import PrivacyCost
from dpsql.progress import Progress, silent
from dpsql.synth import pgm
from dpsql.synth.forecast import Forecast, Planned, baseline, expected_l1, noise_sd
from dpsql.synth.measure import MAX_CELLS, Measurement, count_marginals, measure_counts

Clique = tuple[str, ...]
BIAS = math.sqrt(2 / math.pi)  # E|N(0, sigma^2)| / sigma: the L1 error noise alone explains


# -- the fitted model (everything in it is DP) -----------------------------------------------


@dataclass
class FittedPGM:
    """A Markov random field fitted to DP marginals; sampling it is post-processing."""

    domain: Domain
    inference: pgm.Inference = field(repr=False)
    rows: int
    spent: PrivacyCost
    measurements: list[dict[str, Any]]
    parameters: dict[str, Any]
    diagnostics: dict[str, Any]
    measured: tuple[Measurement, ...] = field(default=(), repr=False)  # DP noisy marginals

    def sample(self, n: int, rng: np.random.Generator) -> pa.Table:
        """``n`` i.i.d. rows of codes drawn from the model with ``rng``."""
        return self.inference.sample(n, rng)

    def describe(self) -> dict[str, Any]:
        """Parameters, measurement descriptors (no counts) and diagnostics."""
        return {"parameters": self.parameters, "measurements": self.measurements,
                "diagnostics": self.diagnostics}


# -- shared pieces ------------------------------------------------------------------------------


def ordered(domain: Domain, columns: Sequence[str]) -> Clique:
    """``columns`` in the domain's order (the order of every count array here)."""
    return tuple(sorted(set(columns), key=domain.names.index))


def l1_to_model(exact: np.ndarray, estimate: np.ndarray) -> int:
    """Integer L1 distance of exact counts from a (public) model estimate rounded to counts.

    Sensitivity: one privacy unit moves it by at most ``max_rows``.
    """
    return int(np.abs(exact - np.rint(estimate).astype(np.int64)).sum())


def row_count(domain: Domain, inference: pgm.Inference) -> int:
    """The declared row count, or the model's DP estimate."""
    return domain.public_rows if domain.public_rows is not None else \
        max(1, round(inference.total))


@dataclass
class ModelFit:
    """One fit in progress: private counts, DP measurements and what they cost."""

    mbi: Any
    domain: Domain
    exact: dict[Clique, np.ndarray] = field(repr=False)
    iters: int
    measured: list[Measurement] = field(default_factory=list)
    spent: PrivacyCost = field(default_factory=lambda: PrivacyCost.zero("zcdp"))
    model: Any = None
    inference: pgm.Inference | None = None

    @classmethod
    def count(cls, mbi: Any, source: duckdb.DuckDBPyRelation, domain: Domain,
              cliques: Sequence[Clique], iters: int) -> ModelFit:
        """Exact counts of every clique a fit may measure or score, in one DuckDB pass."""
        unique = list(dict.fromkeys(cliques))
        return cls(mbi, domain, dict(zip(unique, count_marginals(source, domain, unique),
                                         strict=True)), iters)

    def measure(self, clique: Clique, cost: PrivacyCost) -> Measurement:
        """Discrete Gaussian noise on one marginal (L2 sensitivity max_rows), within ``cost``."""
        m = measure_counts(clique, self.exact[clique], cost, self.domain.max_rows)
        self.measured.append(m)
        self.spent = self.spent + m.cost
        return m

    def select(self, mechanism: ExponentialMechanism, scores: Sequence[int]) -> int:
        """Index chosen by the exponential mechanism; its cost is added to ``spent``."""
        self.spent = self.spent + mechanism.cost("zcdp")
        return mechanism.select(np.asarray(scores, dtype=np.int64))

    def refit(self, iters: int) -> Any:
        """Refit the model to every measurement so far (warm-started)."""
        self.model = pgm.estimate(self.mbi, self.domain, self.measured,
                                  self.domain.public_rows, iters, warm=self.model)
        self.inference = pgm.Inference(self.model, self.domain)
        return self.inference

    def error(self, clique: Clique) -> int:
        """Integer L1 error of the current model on ``clique`` (private: scores only)."""
        assert self.inference is not None
        return l1_to_model(self.exact[clique], self.inference.marginal(clique))

    def fitted(self, parameters: dict[str, Any], diagnostics: dict[str, Any]) -> FittedPGM:
        """The final model, fitted with the full number of iterations."""
        inference = self.refit(self.iters)
        return FittedPGM(self.domain, inference, row_count(self.domain, inference), self.spent,
                         [m.describe() for m in self.measured], parameters, diagnostics,
                         tuple(self.measured))


@dataclass
class SelectMeasureGenerate:
    """Options and public checks AIM and MST share."""

    max_cells: int = 1_000_000
    iters: int = 1000

    def _check_options(self) -> None:
        if not 1 <= self.max_cells <= MAX_CELLS:
            raise ConfigurationError(f"max_cells must be in [1, {MAX_CELLS:,}], "
                                     f"got {self.max_cells}")
        if self.iters < 1:
            raise ConfigurationError(f"iters must be positive, got {self.iters}")

    def _check_budget(self, name: str, domain: Domain, budget: PrivacyCost) -> None:
        """Refuse, before any charge, what the fit could not do (public facts only)."""
        if budget.kind != "zcdp":
            raise ConfigurationError(
                f"{name} adds Gaussian noise, which is not pure DP; use a policy with "
                "accounting: zcdp (budgets can still be written as epsilon and delta)")
        if budget.infinite or budget.is_zero:
            raise ConfigurationError(f"{name} needs a finite, positive budget")
        with pgm.float64():  # the synth extra is installed
            pass
        oneway = sum(domain.shape)
        if oneway > self.max_cells:
            raise ReleaseError(
                f"the 1-way marginals of {', '.join(domain.names)} alone have {oneway:,} "
                f"cells, more than max_cells={self.max_cells:,}; release fewer columns "
                "(--columns), coarser bins in the policy, or raise max_cells")


# -- AIM ------------------------------------------------------------------------------------------


def workload_weights(domain: Domain, workload: Sequence[Clique]) -> dict[Clique, int]:
    """AIM's candidates: every non-empty subset of a workload marginal, with its weight.

    The weight of ``r`` is sum over workload marginals ``s`` of |r & s|: how much of
    the workload a good estimate of ``r`` serves (AIM, Section 4).
    """
    closure = {ordered(domain, sub) for s in workload
               for k in range(1, len(s) + 1) for sub in itertools.combinations(s, k)}
    return {r: sum(len(set(r) & set(s)) for s in workload)
            for r in sorted(closure, key=lambda c: (len(c), [domain.names.index(x) for x in c]))}


@dataclass
class AIM(SelectMeasureGenerate):
    """Workload-aware adaptive selection of marginals, Gaussian measurements, Private-PGM.

    Options: ``workload`` (column sets the release should preserve, ``a+b,c+d``;
    default every 2-way marginal of the released columns), ``rounds`` (the budget
    is first cut in this many equal parts, one per selected marginal; default 16
    per column, as in the paper), ``per_round`` (marginals selected, each with its
    own exponential mechanism from the same model, and measured before one refit;
    the paper's 1 compiles a new model every pick; 3 gave the same workload error
    on Adult and acs10 over 3 seeds in about two thirds of the time),
    ``select_share`` (each part's share for selection, 0.1),
    ``max_cells`` (the model's size limit in cells, reached as the budget is spent),
    ``iters`` / ``round_iters`` (mirror-descent iterations of the final fit and of
    each round's warm-started refit; 1000 / 100: on acs10 at eps 1, 100 a round
    gave the same workload error as 250 over 3 seeds, and a fit's time is mostly
    compiling each round's new model, ``benchmarks/aim_fit_parts.py``).

    Privacy: zCDP. Each 1-way and each measured marginal is a discrete Gaussian
    on counts (L2 sensitivity max_rows). A candidate's score is its workload
    weight times (the integer L1 error of the current model on it minus the error
    noise alone explains), so one unit moves it by at most max_rows times the
    largest weight: the exponential mechanism at that sensitivity is
    (epsilon^2 / 8)-zCDP. Picks and measurements compose adaptively; the last
    round spends what is left, so the total is the budget (less rounding, never
    more). When a round's measured marginals move the model less than their noise
    explains (together), later parts get four times the budget (annealing).
    McKenna et al., VLDB 2022.
    """

    name: ClassVar[str] = "aim"
    is_dp: ClassVar[bool] = True
    workload: tuple[tuple[str, ...], ...] | None = None
    rounds: int | None = None
    select_share: float = 0.1
    round_iters: int = 100
    per_round: int = 3

    def __post_init__(self) -> None:
        self._check_options()
        if not 0 < self.select_share < 1:
            raise ConfigurationError(f"select_share must be in (0, 1), got {self.select_share}")
        if self.round_iters < 1:
            raise ConfigurationError(f"round_iters must be positive, got {self.round_iters}")
        if self.per_round < 1:
            raise ConfigurationError(f"per_round must be positive, got {self.per_round}")

    def _workload(self, domain: Domain) -> list[Clique]:
        if self.workload is None:
            pairs: list[Clique] = list(itertools.combinations(domain.names, 2))
            return pairs or [(c,) for c in domain.names]
        unknown = sorted({c for s in self.workload for c in s} - set(domain.names))
        if unknown or not self.workload or not all(self.workload):
            raise ConfigurationError(f"workload must list non-empty sets of the released "
                                     f"columns ({', '.join(domain.names)}); unknown: "
                                     f"{', '.join(unknown) or 'none'}")
        return [ordered(domain, s) for s in self.workload]

    def _rounds(self, domain: Domain) -> int:
        rounds = self.rounds if self.rounds is not None else 16 * len(domain.names)
        if rounds <= len(domain.names):
            raise ConfigurationError(f"rounds must exceed the number of columns "
                                     f"({len(domain.names)}): the 1-way marginals use one each")
        return rounds

    def _candidates(self, domain: Domain) -> dict[Clique, int]:
        weights = workload_weights(domain, self._workload(domain))
        return {r: w for r, w in weights.items() if domain.size(r) <= self.max_cells}

    def check(self, domain: Domain, budget: PrivacyCost) -> None:
        """Refuse what fit would refuse, before the release charges the budget.

        Every round gets at least the first round's parts, so calibrating those
        here means no round can fail for a too small budget after the charge.
        """
        self._check_budget("aim", domain, budget)
        measure_cost, select_cost = self._round_costs(domain, budget)
        additive("zcdp", domain.max_rows, measure_cost)  # as ModelFit.measure will sample it
        ExponentialMechanism.calibrate(domain.max_rows * self._heaviest(domain), select_cost)

    def _round_costs(self, domain: Domain, budget: PrivacyCost) -> list[PrivacyCost]:
        """The measurement and selection parts of one of the first rounds."""
        return budget.split([1] * self._rounds(domain))[0].split(
            [1 - self.select_share, self.select_share])

    def _heaviest(self, domain: Domain) -> int:
        """The largest workload weight: the scores' sensitivity is max_rows times it."""
        return max(self._candidates(domain).values())

    def forecast(self, domain: Domain, budget: PrivacyCost) -> Forecast:
        """The first rounds' noise: each column's 1-way marginal, then one marginal a round.

        Later rounds may get more (AIM raises a round's share when the model stops
        improving), never less.
        """
        rounds = self._rounds(domain)
        measure_cost, _ = self._round_costs(domain, budget)
        sd, mechanism = noise_sd(measure_cost, domain.max_rows)
        columns = len(domain.names)
        oneway = Planned("1-way marginal of each column", columns, max(domain.shape),
                         mechanism, sd)
        candidates = self._candidates(domain)
        widest = max((domain.size(c) for c in candidates), default=max(domain.shape))
        chosen = Planned("marginal chosen by the exponential mechanism, one a round",
                         rounds - columns, widest, mechanism, sd)
        errors = [expected_l1(sd, mechanism, n) for n in domain.shape]
        return Forecast(self.name, (oneway, chosen), domain.public_rows,
                        baseline(domain, budget), oneway=sum(errors) / columns,
                        notes=(f"{rounds} rounds at most; the workload has {len(candidates)} "
                               "candidate marginals within max_cells",))

    def fit(self, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
            rng: np.random.Generator, progress: Progress | None = None) -> FittedPGM:
        """Measure the 1-ways, then select and measure marginals until the budget is spent."""
        report = progress or silent
        self.check(domain, budget)
        candidates = self._candidates(domain)
        oneway = [(c,) for c in domain.names]
        rounds = self._rounds(domain)
        measure_cost, select_cost = self._round_costs(domain, budget)
        heaviest = self._heaviest(domain)
        log: list[dict[str, Any]] = []
        with pgm.float64() as mbi:
            fit = ModelFit.count(mbi, source, domain, oneway + list(candidates), self.iters)
            for clique in oneway:
                fit.measure(clique, measure_cost)
            fit.refit(self.round_iters)
            last, number = False, 0
            while not last:
                number += 1
                report("round", float(fit.spent) / float(budget), 1.0)
                remaining = budget - fit.spent
                last = remaining < (measure_cost + select_cost).times(2 * self.per_round)
                if last:  # each of the round's picks gets an equal part of what is left
                    measure_cost, select_cost = remaining.split([1] * self.per_round)[0].split(
                        [1 - self.select_share, self.select_share])
                sigma = GaussianMechanism.calibrate(domain.max_rows, measure_cost).sigma
                mechanism = ExponentialMechanism.calibrate(domain.max_rows * heaviest,
                                                           select_cost)
                picks = self._select_round(fit, candidates, mechanism, sigma,
                                           measure_cost + select_cost, float(budget))
                chosen = [c for c, _ in picks]
                assert fit.inference is not None
                before = [fit.inference.marginal(c) for c in chosen]
                scales = [fit.measure(c, measure_cost).scale for c in chosen]
                log.extend({"round": number, "clique": list(c), "candidates": n,
                            "sigma": scale, "epsilon": float(mechanism.epsilon)}
                           for (c, n), scale in zip(picks, scales, strict=True))
                after = fit.refit(self.round_iters)
                change = sum(np.abs(after.marginal(c) - b).sum()
                             for c, b in zip(chosen, before, strict=True))
                if change <= BIAS * sum(s * domain.size(c)
                                        for c, s in zip(chosen, scales, strict=True)):
                    measure_cost, select_cost = measure_cost.times(4), select_cost.times(4)
            report("round", 1.0, 1.0)
            report("estimate", 0, 1)
            fitted = fit.fitted(self._parameters(domain, rounds),
                                {"rounds": log, "model_cells": pgm.model_cells(
                                    domain, [m.columns for m in fit.measured])})
            report("estimate", 1, 1)
        return fitted

    def _select_round(self, fit: ModelFit, candidates: dict[Clique, int],
                      mechanism: ExponentialMechanism, sigma: float, pick_cost: PrivacyCost,
                      budget: float) -> list[tuple[Clique, int]]:
        """Up to ``per_round`` distinct marginals, each with its number of candidates.

        Each is picked by the exponential mechanism from the current model's scores,
        among candidates within the model size the budget used so far allows, with
        the round's earlier picks counted in.
        """
        start = fit.spent
        errors: dict[Clique, int] = {}  # the round's model does not change between picks
        picks: list[tuple[Clique, int]] = []
        for _ in range(self.per_round):
            chosen = [c for c, _ in picks]
            used = float(start + pick_cost.times(len(chosen) + 1)) / budget
            live = [r for r in self._live(fit, candidates, self.max_cells * used, chosen)
                    if r not in chosen]
            if not live:  # a tiny domain: later rounds (or, in the last, nothing) spend the rest
                break
            for r in live:
                if r not in errors:
                    errors[r] = fit.error(r)
            scores = [candidates[r] * (errors[r] - round(BIAS * sigma * fit.domain.size(r)))
                      for r in live]
            picks.append((live[fit.select(mechanism, scores)], len(live)))
        return picks

    def _live(self, fit: ModelFit, candidates: dict[Clique, int], limit: float,
              chosen: Sequence[Clique] = ()) -> list[Clique]:
        """Candidates the model can take within ``limit`` cells (or already covers)."""
        cliques = [m.columns for m in fit.measured] + list(chosen)
        covered = {ordered(fit.domain, sub) for c in cliques
                   for k in range(1, len(c) + 1) for sub in itertools.combinations(c, k)}
        return [r for r in candidates
                if r in covered or pgm.model_cells(fit.domain, [*cliques, r]) <= limit]

    def _parameters(self, domain: Domain, rounds: int) -> dict[str, Any]:
        return {"workload": [list(s) for s in self._workload(domain)], "rounds": rounds,
                "select_share": self.select_share, "max_cells": self.max_cells,
                "iters": self.iters, "round_iters": self.round_iters,
                "per_round": self.per_round}
