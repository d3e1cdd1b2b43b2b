"""NAPSU-MQ: noise-aware synthetic data from noisy marginals (Räisä et al., AISTATS 2023).

Privacy: the data are touched only by (1) MST selection when ``select=mst``
(noisy 1-way marginals and exponential-mechanism rounds, its ``select_share``
of rho, see :mod:`.mst`) and (2) one GROUPING SETS pass measuring the full
marginal of every clique with discrete Gaussian noise (the rest of rho, split
equally: L2 sensitivity sqrt(d) * max_rows for d cliques under add/remove of
one privacy unit; the paper states sqrt(2d) under substitution). Everything
after that (canonical pruning, inference, sampling) is post-processing, so the
posterior and any number of synthetic copies are DP at the same cost. Gaussian
noise needs zCDP accounting; pure-DP policies are refused.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
from threadpoolctl import threadpool_limits

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError
from dpsql.policy import did_you_mean
from dpsql.privacy import PrivacyCost
from dpsql.progress import Progress, silent
from dpsql.synth.base import SynthesizerWarning
from dpsql.synth.forecast import Forecast, Planned, baseline, expected_l1, noise_sd
from dpsql.synth.measure import measure_marginals
from dpsql.synth.napsu_mq import checks as fit_checks
from dpsql.synth.napsu_mq import estimate as cost_estimate
from dpsql.synth.napsu_mq import laplace as laplace_step
from dpsql.synth.napsu_mq import mst, resample
from dpsql.synth.napsu_mq import posterior as post
from dpsql.synth.napsu_mq.evidence import Observed, reduce
from dpsql.synth.napsu_mq.model import compiled_marginals
from dpsql.synth.napsu_mq.sampling import sample_records
from dpsql.synth.napsu_mq.structure import Structure

STATE_VERSION = 1
SAMPLINGS = ("random", "rounded", "predictive")
PREDICTIVE_DRAWS = 100  # posterior draws one ``sampling=predictive`` copy is spread over
RHAT_LIMIT = 1.01
MIN_ESS = 400
WEAK_FRACTION = 0.5  # Laplace sd above this share of prior_sd: weakly identified


class DiagnosticsWarning(SynthesizerWarning):
    """The posterior inference shows signs of trouble (see describe()['diagnostics'])."""


@dataclass
class NapsuMQ:
    """Noise-aware Bayesian synthesis (NAPSU-MQ): a posterior over the data, copies from it.

    Options (each settable as ``--option key=value``):
    ``cliques`` are marginals always measured ("a+b,c+d"); ``select=mst`` adds a
    spanning tree of pairs chosen by MST with ``select_share`` of the budget,
    ``select=none`` measures only ``cliques`` (plus 1-way marginals of columns
    they miss). ``inference`` is ``nuts`` (exact MCMC, slower) or ``laplace``.
    NUTS chains run independently on ``workers`` threads (0: one per core).
    ``covariance`` is ``exact`` (the likelihood's covariance n Sigma(theta) + noise
    moves with theta, as in the paper) or ``mode`` (fixed at the Laplace mode: an
    approximation that makes each NUTS step 20-40x cheaper on Adult; NUTS only;
    its effect on coverage is measured in docs/napsu_mq.md), or ``corrected``
    (NUTS moves on the fixed-covariance posterior, each iteration corrected by a
    Metropolis-Hastings step with the exact likelihood: exact, not an
    approximation). ``pilot_warmup`` + ``pilot_samples`` > 0 first run a short
    pilot on the cheap fixed-covariance posterior whose draws whiten and start
    the real run; ``jumps`` Metropolis-Hastings updates per iteration along
    cell directions (cells with a heavy pilot tail or a noisy count near zero;
    proposals fitted to the pilot, plus the conditional prior) and ``moves`` NUTS
    transitions per iteration only tune the sampler (docs/napsu_mq.md). The
    defaults are this tuned exact sampler (on Adult: 5-7 min, R-hat <= 1.01);
    ``covariance=exact pilot_samples=0 moves=1 jumps=0`` is the paper's plain NUTS.
    ``sampling`` is how a copy's records are drawn: ``random`` (one posterior draw
    per copy, i.i.d. records: what Rubin's rules assume), ``rounded`` (the same,
    with each conditional's counts rounded from their expectation, as private-pgm
    generates MST's data) or ``predictive`` (the rows spread over 100 posterior
    draws, each part rounded: on Adult the lowest workload error of one copy).
    Only ``random`` copies may be combined with Rubin's rules; the others warn.
    Before any charge the largest model the options allow is estimated from the
    domain (parameters, memory, minutes; :mod:`.estimate`) and refused beyond
    ``max_parameters``, ``max_memory_mb`` or ``max_minutes``; MST selection
    stops adding pairs at ``max_parameters``.
    """

    cliques: tuple[tuple[str, ...], ...] = ()
    select: str = "mst"
    select_share: float = 0.2
    inference: str = "nuts"
    covariance: str = "corrected"
    pilot_warmup: int = 400
    pilot_samples: int = 400
    moves: int = 3
    jumps: int = 48
    chains: int = 4
    warmup: int = 800
    samples: int = 2000
    max_tree_depth: int = 12
    target_accept: float = 0.8
    workers: int = 0
    laplace_iterations: int = 6000
    restarts: int = 5
    prior_sd: float = 10.0
    keep_draws: int = 1000
    sampling: str = "random"
    max_parameters: int = 1000
    max_memory_mb: float = 4096
    max_minutes: float = 30

    name = "napsu_mq"
    is_dp = True

    def __post_init__(self) -> None:
        self.cliques = tuple(tuple(c) for c in self.cliques)
        checks = [
            (self.select in ("mst", "none"), "select must be 'mst' or 'none'"),
            (self.inference in ("nuts", "laplace"), "inference must be 'nuts' or 'laplace'"),
            (self.sampling in SAMPLINGS, f"sampling must be one of {', '.join(SAMPLINGS)}"),
            (self.covariance in ("exact", "mode", "corrected"),
             "covariance must be 'exact', 'mode' or 'corrected'"),
            (self.pilot_warmup >= 0 and self.pilot_samples >= 0,
             "pilot_warmup and pilot_samples must be non-negative"),
            (self.moves >= 1, "moves must be at least 1"),
            (self.jumps >= 0, "jumps must be non-negative"),
            (self.jumps == 0 or self.pilot_samples > 0,
             "jumps are fitted to pilot draws: set pilot_samples, or jumps=0"),
            (0 < self.select_share < 1, "select_share must be between 0 and 1"),
            (self.chains >= 1, "chains must be at least 1"),
            (self.warmup >= 1 and self.samples >= 1, "warmup and samples must be positive"),
            (1 <= self.max_tree_depth <= 15, "max_tree_depth must be in 1..15"),
            (self.workers >= 0, "workers must be 0 (one per core) or positive"),
            (0 < self.target_accept < 1, "target_accept must be between 0 and 1"),
            (self.prior_sd > 0, "prior_sd must be positive"),
            (self.keep_draws >= 1, "keep_draws must be positive"),
            (self.laplace_iterations >= 1 and self.restarts >= 0,
             "laplace_iterations must be positive and restarts non-negative"),
            (self.max_parameters >= 1 and self.max_memory_mb > 0 and self.max_minutes > 0,
             "max_parameters, max_memory_mb and max_minutes must be positive"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigurationError(f"napsu_mq: {message}")

    # -- fitting ---------------------------------------------------------------------
    def check(self, domain: Domain, budget: PrivacyCost) -> None:
        """Refuse what fit would refuse, before the release charges the budget."""
        if budget.kind != "zcdp":
            raise ConfigurationError(
                "napsu_mq adds Gaussian noise, which is not pure DP; use a policy with "
                "accounting: zcdp (budgets can still be written as epsilon and delta)")
        if budget.is_zero:
            raise ConfigurationError("napsu_mq needs a positive budget")
        self.estimate(domain)

    def estimate(self, domain: Domain) -> cost_estimate.Estimate:
        """The largest model these options can build on ``domain``; refused beyond the limits."""
        required = self._required(domain)
        base = cost_estimate.base_structure(domain.names, domain.shape, required)
        extra = 0
        if self.select == "mst":
            sizes = dict(zip(domain.names, domain.shape, strict=True))
            extra = cost_estimate.heaviest_forest(sizes, required)
        limits = cost_estimate.Limits(self.max_parameters, self.max_memory_mb, self.max_minutes)
        iterations = self.pilot_warmup + self.pilot_samples + self.warmup + self.samples
        return cost_estimate.largest_fitting(
            base, extra, limits, nuts=self.inference == "nuts", chains=self.chains,
            iterations=iterations, jumps=self.jumps, keep=self.keep_draws,
            workers=self.workers)

    def forecast(self, domain: Domain, budget: PrivacyCost) -> Forecast:
        """The marginals it measures, the largest model it may build and its fit time.

        With ``select=mst`` the pairs are a tree: as many as the columns less one, at most.
        """
        required = self._required(domain)
        columns = len(domain.names)
        found = self.estimate(domain)
        planned = []
        oneway: float | None = None
        if self.select == "mst":
            half = self.select_share / 2
            oneway_part, _, measure_part = budget.split([half, half, 1 - 2 * half])
            sd, mechanism = noise_sd(oneway_part.split([1] * columns)[0], domain.max_rows)
            planned.append(Planned("1-way marginal of each column (for the selection)", columns,
                                   max(domain.shape), mechanism, sd))
            oneway = sum(expected_l1(sd, mechanism, n) for n in domain.shape) / columns
            cliques = len(required) + columns - 1
        else:
            covered = {c for clique in required for c in clique}
            cliques = len(required) + sum(1 for c in domain.names if c not in covered)
            measure_part = budget
        sd, mechanism = noise_sd(measure_part.split([1] * max(cliques, 1))[0], domain.max_rows)
        widest = max([domain.size(c) for c in required] + list(domain.shape))
        planned.append(Planned("marginal of the model (its cliques)", max(cliques, 1),
                               widest, mechanism, sd, at_most=self.select == "mst"))
        notes = (f"the model: at most {found.parameters:,} parameters, "
                 f"{found.memory_mb:,.0f} MB, about {found.minutes:,.1f} minutes of "
                 f"{self.inference} on this machine",)
        return Forecast(self.name, tuple(planned), domain.public_rows, baseline(domain, budget),
                        oneway=oneway, notes=notes)

    def fit(self, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
            rng: np.random.Generator, progress: Progress | None = None) -> FittedNapsuMQ:
        """Measure, infer the posterior, and return a model that samples copies."""
        progress = progress or silent
        self.check(domain, budget)
        found = self.estimate(domain)
        required = self._required(domain)
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        observed: list[Observed] = []
        described: dict[str, Any] = {}
        spent = PrivacyCost.zero("zcdp")
        index = {c: i for i, c in enumerate(domain.names)}
        if self.select == "mst":
            progress("select", 0, 1)
            half = self.select_share / 2
            oneway_part, select_part, measure_part = budget.split([half, half, 1 - 2 * half])
            base = cost_estimate.base_structure(domain.names, domain.shape, required).dim
            selection = mst.select(source, domain, required, oneway_part, select_part,
                                   room=found.parameters - base)
            cliques = [*required, *selection.pairs]
            observed += [Observed((index[m.columns[0]],), m.noisy, m.variance)
                         for m in selection.oneway]
            spent = spent + selection.spent
            described["selection"] = selection.describe()
            timings["select"] = time.perf_counter() - t0
            progress("select", 1, 1)
        else:
            covered = {c for clique in required for c in clique}
            cliques = [*required, *((c,) for c in domain.names if c not in covered)]
            measure_part = budget
        covered = {c for clique in cliques for c in clique}  # a forest may leave columns out
        scopes = [*cliques, *((c,) for c in domain.names if c not in covered)]
        structure = Structure.build(domain.shape, [[index[c] for c in q] for q in scopes])
        assert structure.dim <= found.parameters, "the pre-charge estimate is a bound"
        t1 = time.perf_counter()
        progress("measure", 0, 1)
        measured = measure_marginals(source, domain, cliques, measure_part)
        observed += [Observed(tuple(index[c] for c in m.columns), m.noisy, m.variance)
                     for m in measured]
        spent = spent + sum((m.cost for m in measured), PrivacyCost.zero("zcdp"))
        timings["measure"] = time.perf_counter() - t1
        progress("measure", 1, 1)
        reduced = reduce(structure, observed, domain.public_rows)
        diagnostics: dict[str, Any] = {}
        with jax.enable_x64(True), threadpool_limits(1):
            fitted = laplace_step.fit(structure, reduced, self.prior_sd, rng, progress,
                                      self.laplace_iterations, self.restarts)
            timings["laplace"] = fitted.seconds
            diagnostics["laplace"] = fitted.describe()
            # Parameters whose Laplace sd is near the prior's: the data barely bind them
            # (near-empty cells), and a symmetric Gaussian is a poor fit there.
            laplace_sd = np.sqrt(np.diag(fitted.cov))[: structure.dim]
            diagnostics["laplace"]["weakly_identified"] = int(
                (laplace_sd > WEAK_FRACTION * self.prior_sd).sum())
            posterior: post.Posterior = post.Gaussian(fitted.mean, fitted.cov)
            if self.inference == "laplace":
                resampled, ess = resample.resample(
                    resample.posterior_density(structure, laplace_step.evidence_arrays(
                        reduced, self.prior_sd)), fitted.mean, fitted.cov, rng, self.keep_draws)
                diagnostics["laplace"]["importance_ess"] = round(ess, 1)
                posterior = post.Samples(resampled)
            if self.inference == "nuts":
                from dpsql.synth.napsu_mq import nuts  # NumPyro: only for this inference

                draws = nuts.sample(structure, reduced, fitted, self.prior_sd,
                                    chains=self.chains, warmup=self.warmup,
                                    samples=self.samples, max_tree_depth=self.max_tree_depth,
                                    target_accept=self.target_accept, rng=rng,
                                    progress=progress, workers=self.workers,
                                    covariance=self.covariance,
                                    pilot=(self.pilot_warmup, self.pilot_samples),
                                    moves=self.moves, jumps=self.jumps)
                diagnostics["nuts"] = draws.diagnostics
                timings.update({f"nuts_{k}": v for k, v in draws.timings.items()})
                posterior = post.Samples(post.thin(draws.phi, self.keep_draws))
        timings["total"] = time.perf_counter() - t0
        diagnostics["warnings"] = self._warnings(diagnostics)
        diagnostics["checks"] = [*fit_checks.checks(diagnostics), fit_checks.fit_check(
            fit_checks.measurement_fit(structure, posterior, observed), domain.names)]
        diagnostics["converged"] = all(c["passed"] for c in diagnostics["checks"])
        if self.sampling != "random":
            diagnostics["warnings"].append(
                f"sampling={self.sampling}: the copies are not i.i.d. draws; do not combine "
                "them with Rubin's rules (their intervals would be too narrow); release "
                "with sampling=random for that")
        for message in diagnostics["warnings"]:
            warnings.warn(f"napsu_mq: {message}", DiagnosticsWarning, stacklevel=2)
        mean, sd = posterior.summary()
        rows: dict[str, Any] = {"source": "dp" if reduced.free_n else "declared",
                                "estimate": reduced.n0}
        if reduced.free_n:
            rows["estimate"] = reduced.n0 + reduced.n_scale * float(mean[-1])
            rows["posterior_sd"] = reduced.n_scale * float(sd[-1])
        info = {
            "parameters": asdict(self),
            "model": {"cliques": [list(q) for q in scopes], "parameters": structure.dim,
                      "rows": rows,
                      "junction_tree": [[domain.names[j] for j in c] for c in structure.tree],
                      "noise_variance": "sigma^2 of the discrete Gaussian (an upper bound)"},
            "estimate": found.describe(),
            "measurements": [m.describe() for m in measured],
            **described,
            "diagnostics": diagnostics,
        }
        return FittedNapsuMQ(structure, domain.names, posterior, spent, info,
                             max(1, round(rows["estimate"])), self.sampling, timings)

    def _required(self, domain: Domain) -> list[tuple[str, ...]]:
        out = []
        for clique in self.cliques:
            for column in clique:
                if column not in domain.names:
                    raise ConfigurationError(
                        f"napsu_mq: clique {'+'.join(clique)!r} uses {column!r}, which is not "
                        f"among the released columns ({', '.join(domain.names)})"
                        f"{did_you_mean(column, list(domain.names))}; a clique joins columns "
                        "given with --columns")
            if len(set(clique)) != len(clique) or not clique:
                raise ConfigurationError(f"napsu_mq: clique {'+'.join(clique)!r} repeats a "
                                         "column or is empty")
            out.append(tuple(clique))
        return out

    @staticmethod
    def _warnings(diagnostics: dict[str, Any]) -> list[str]:
        out = []
        lap = diagnostics["laplace"]
        if not lap["converged"]:
            out.append("the Laplace approximation did not converge "
                       f"({'; '.join(lap['notes']) or 'iteration limit'})")
        chain = diagnostics.get("nuts")
        ess = lap.get("importance_ess")
        if ess is not None and ess < resample.MIN_ESS:
            out.append(f"the Laplace Gaussian fits the posterior poorly (importance-sampling "
                       f"effective sample size {ess:.0f} < {resample.MIN_ESS} of "
                       f"{resample.PROPOSALS} "
                       "draws; some parameters are barely bound by the data): the copies "
                       "repeat a few posterior draws, so Rubin's intervals are too narrow; use "
                       "inference=nuts, or coarser bins")
        if chain:
            if chain["max_rhat"] is not None and chain["max_rhat"] > RHAT_LIMIT:
                out.append(f"max R-hat {chain['max_rhat']:.3f} > {RHAT_LIMIT}: chains disagree; "
                           "run more warmup/samples")
            if chain["min_ess"] < MIN_ESS:
                out.append(f"min effective sample size {chain['min_ess']:.0f} < {MIN_ESS}; "
                           "run more samples")
            if chain["divergences"]:
                out.append(f"{chain['divergences']} divergent transitions; raise target_accept")
        return out

    # -- resuming --------------------------------------------------------------------
    @classmethod
    def restore(cls, state: dict[str, Any], domain: Domain) -> FittedNapsuMQ:
        """A fitted model from :meth:`FittedNapsuMQ.state` (no data, no privacy cost)."""
        if state.get("version") != STATE_VERSION:
            raise ConfigurationError("this napsu_mq state was written by another version")
        columns = list(state["columns"])
        if list(domain.names) != columns or list(domain.shape) != list(state["sizes"]):
            raise ConfigurationError("the dataset's domain changed since this release; "
                                     "release again instead of drawing more copies")
        index = {c: i for i, c in enumerate(columns)}
        structure = Structure.build(domain.shape, [[index[c] for c in q]
                                                   for q in state["cliques"]])
        info = state.get("describe", {})
        sampling = info.get("parameters", {}).get("sampling", "random")  # older states: random
        if sampling not in SAMPLINGS:
            raise ConfigurationError(f"this napsu_mq state has an unknown sampling {sampling!r}")
        return FittedNapsuMQ(structure, domain.names, post.from_state(state["posterior"]),
                             PrivacyCost.zero("zcdp"), info, int(state["rows"]), sampling)


@dataclass
class FittedNapsuMQ:
    """A NAPSU-MQ posterior: each :meth:`sample` call is one synthetic copy."""

    structure: Structure
    columns: tuple[str, ...]
    posterior: post.Posterior
    spent: PrivacyCost
    info: dict[str, Any]
    rows: int
    sampling: str = "random"
    timings: dict[str, float] = field(default_factory=dict)  # for benchmarks, never released

    def sample(self, n: int, rng: np.random.Generator) -> pa.Table:
        """One synthetic copy of ``n`` rows: theta from the posterior, then records from it.

        With ``sampling=predictive`` the rows are spread over ``PREDICTIVE_DRAWS``
        posterior draws instead of one (each part rounded), so each row follows
        the posterior predictive distribution (mixed over those draws).
        """
        n = int(n)
        if self.sampling == "predictive":
            sizes = [n // PREDICTIVE_DRAWS + (i < n % PREDICTIVE_DRAWS)
                     for i in range(PREDICTIVE_DRAWS)]
            parts = [self._records(self.posterior.draw(rng), size, rng, True)
                     for size in sizes if size]
            codes = np.concatenate(parts or [np.empty((0, len(self.columns)), np.int64)])
            codes = codes[rng.permutation(n)]
        else:
            codes = self._records(self.posterior.draw(rng), n, rng, self.sampling == "rounded")
        return pa.table({c: pa.array(codes[:, j], type=pa.int32())
                         for j, c in enumerate(self.columns)})

    def _records(self, phi: np.ndarray, n: int, rng: np.random.Generator,
                 rounded: bool) -> np.ndarray:
        with jax.enable_x64(True):
            tables = compiled_marginals(self.structure)(jnp.asarray(phi[: self.structure.dim]))
            tables = [np.asarray(t) for t in tables]
        return sample_records(self.structure, tables, n, rng, rounded=rounded)

    def describe(self) -> dict[str, Any]:
        """Parameters, measurement descriptors, selection, diagnostics and a posterior summary."""
        return dict(self.info)

    def state(self) -> dict[str, Any]:
        """JSON-able DP state: structure, row count and the posterior (draws or Gaussian)."""
        return {"version": STATE_VERSION, "columns": list(self.columns),
                "sizes": list(self.structure.sizes),
                "cliques": self.info["model"]["cliques"], "rows": self.rows,
                "posterior": self.posterior.state(), "describe": self.describe()}

