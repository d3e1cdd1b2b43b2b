"""``modp``: minus-one data prediction (Press 2024), empirical as published or DP.

``mode=empirical`` is the paper's method: learn each column's distribution
given all the others, then redraw every column of every true row from it.

``mode=dp`` (beyond the paper) trains the same model with DP-SGD on the MSE
loss and instantiates it from DP seed rows drawn from noisy one-way marginals
(the ``independent`` histogram), resampling every column from the model for a
few passes; it never touches a real row after training.

Privacy: ``empirical`` is not DP. It spends nothing, needs the policy's
``allow_non_dp: true``, is labelled ``privacy: empirical`` by the release and
reports the paper's section-6 diagnostics; ``passthrough`` (true values copied
through) lowers privacy further and must be named in the policy's
``allow_options``. ``dp``: the seed marginals (discrete Gaussian counts, one
per column, sensitivity ``max_rows`` each) cost ``seed_share`` of the budget
and DP-SGD the rest (see :mod:`dpsql.synth.modp.dpsgd` and
:mod:`dpsql.synth.modp.accounting`), in zCDP; the total never exceeds the budget.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import duckdb
import numpy as np
import torch

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError
from dpsql.privacy import PrivacyCost
from dpsql.progress import Progress, silent
from dpsql.synth.forecast import Forecast, Planned, baseline, oneway_plan
from dpsql.synth.modp import device as devices
from dpsql.synth.modp import diagnostics, postprocess
from dpsql.synth.modp.blocks import Blocks
from dpsql.synth.modp.checks import seed_marginals_kept
from dpsql.synth.modp.fitted import DPSeeds, FittedModp, Refinements
from dpsql.synth.modp.instantiate import instantiate
from dpsql.synth.modp.model import MultiBladeModel, parameter_count
from dpsql.synth.modp.options import ModpOptions
from dpsql.synth.modp.train import Schedule, train_empirical

MAX_WEIGHTS = 50_000_000  # blade weights (blades x categories^2) a fit may allocate
#: The forecast's verdict (:meth:`Modp.forecast`): DP-SGD steps whose noise is at least this
#: many times the largest possible mean gradient, with seed marginals at least SEEDS_WORSE
#: times independent's error. Matched on ACS Texas (acs10, epsilon 1), where modp lost to
#: independent at a step noise ratio above 1 and seeds 3.2x worse.
NOISE_DOMINATED = 1.0
SEEDS_WORSE = 2.0


@dataclass
class Modp(ModpOptions):
    """Minus-one data prediction (Press 2024): not DP as published; DP with mode=dp.

    The options are :class:`~dpsql.synth.modp.options.ModpOptions`' fields.
    """

    def check(self, domain: Domain, budget: PrivacyCost) -> None:
        """Public checks before any budget is charged: accounting and model size."""
        if self.mode == "dp" and budget.kind != "zcdp":
            raise ConfigurationError("MODP's DP mode adds Gaussian noise and is accounted in "
                                     "zCDP; use a policy with accounting: zcdp")
        width = sum(domain.shape)
        if self.blades * width * width > MAX_WEIGHTS:
            raise ConfigurationError(
                f"{len(domain)} columns with {width} categories in all make {self.blades} "
                f"blades of {width}x{width} weights, too many; choose fewer or coarser columns "
                "(bins in the policy) or fewer blades")
        if self.mode == "dp" and not budget.infinite:
            self._check_dp_sgd(domain, budget)

    def _check_dp_sgd(self, domain: Domain, budget: PrivacyCost) -> None:
        """Calibrate DP-SGD's noise as the fit will, on the least budget it may get.

        A budget too small for the samplers is refused here, not in the worker after
        the charge.
        """
        from dpsql import noise
        from dpsql.synth.modp import accounting
        from dpsql.synth.modp.dpsgd import step_sensitivity

        train, dimension, multiplier = self._dp_sgd_plan(domain, budget)
        if train.is_zero:
            raise ConfigurationError("no budget is left for DP-SGD; lower seed_share or raise "
                                     "the release's epsilon")
        _, sensitivity = step_sensitivity(dimension, self.clip, domain.max_rows, multiplier)
        accounting.calibrate(train, sensitivity, self.steps, noise.used_gaussian_sigma2)

    def _dp_sgd_plan(self, domain: Domain, budget: PrivacyCost) -> tuple[PrivacyCost, int, float]:
        """DP-SGD's least budget (the fit gets at least this), coordinates and noise multiplier."""
        from dpsql.synth.modp.dpsgd import noise_multiplier

        train = budget.split([self.seed_share, 1 - self.seed_share])[1]
        dimension = parameter_count(Blocks.from_domain(domain), self.blades,
                                    self.reduced_features)
        return train, dimension, noise_multiplier(self.steps, train)

    def forecast(self, domain: Domain, budget: PrivacyCost) -> Forecast:
        """DP mode: the seed marginals' noise and DP-SGD's, and whether they can beat independent.

        The seeds are ``independent`` at ``seed_share`` of the budget. DP-SGD adds
        noise of sd ``multiplier * max_rows * clip`` to each of ``d`` coordinates of a
        step's summed gradient (its sensitivity: a privacy unit's ``max_rows`` rows),
        against at most ``clip`` per row: a mean gradient over ``batch`` rows carries
        noise of norm about ``multiplier * max_rows * sqrt(d) / batch`` times the
        largest possible signal. When that exceeds 1 and the seeds' 1-way
        marginals carry twice the error of independent's, nothing can make up for
        them (:data:`NOISE_DOMINATED`): the forecast says it cannot beat independent.
        """
        if self.mode != "dp":
            return Forecast(self.name, (), domain.public_rows, None, dp=False,
                            notes=("empirical mode: trained on the real rows as published "
                                   "(Press 2024); no noise, so no forecast",))
        seed_budget = budget.split([self.seed_share, 1 - self.seed_share])[0]
        seeds, seeds_error = oneway_plan(domain, seed_budget,
                                         what="1-way marginal of each column (the seeds)")
        yardstick = baseline(domain, budget)
        _, dimension, multiplier = self._dp_sgd_plan(domain, budget)
        planned = (seeds, Planned(f"DP-SGD, {self.steps} steps", 1, dimension, "DP-SGD",
                                  multiplier))
        notes, worse = [], ""
        rows = domain.public_rows
        if rows is None:
            notes.append("declare the row count (public_row_count) to forecast whether "
                         "DP-SGD's signal rises above its noise")
        else:
            batch = max(self.sampling_rate * rows, 1.0)
            ratio = multiplier * domain.max_rows * math.sqrt(dimension) / batch
            notes.append(f"each DP-SGD step's noise is {ratio:.2g}x the largest possible mean "
                         f"gradient of {batch:,.0f} rows (noise multiplier {multiplier:.3g} "
                         f"over {dimension:,} coordinates)")
            if ratio >= NOISE_DOMINATED and seeds_error >= SEEDS_WORSE * yardstick:
                worse = (f"its 1-way marginals come from seeds measured with "
                         f"{self.seed_share:.0%} of the budget ({seeds_error / yardstick:.2g}x "
                         f"independent's error), and DP-SGD's steps are mostly noise "
                         f"({ratio:.2g}x the signal), so the model cannot make up for them; "
                         "raise epsilon, declare fewer or coarser columns, or use "
                         "independent, mst or aim")
        return Forecast(self.name, planned, rows, yardstick, oneway=seeds_error,
                        notes=tuple(notes), worse=worse)

    def fit(self, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
            rng: np.random.Generator, progress: Progress | None = None) -> FittedModp:
        """Fit on the bounded ``source``: empirically, or within ``budget`` (zCDP) in DP mode."""
        progress = progress or silent
        self.check(domain, budget)
        blocks = Blocks.from_domain(domain)
        dev = devices.resolve(self.device)
        gen = devices.generator(dev, int(rng.integers(2**63)))
        model = MultiBladeModel(blocks, self.blades, self.reduced_features,
                                generator=torch.Generator().manual_seed(int(rng.integers(2**63))))
        model.to(dev)
        if self.mode == "dp":
            return self._fit_dp(source, domain, budget, rng, progress, model, gen)
        return self._fit_empirical(source, domain, budget, rng, progress, model, gen)

    # -- empirical ------------------------------------------------------------------------
    def _fit_empirical(self, source: duckdb.DuckDBPyRelation, domain: Domain,
                       budget: PrivacyCost, rng: np.random.Generator, progress: Progress,
                       model: MultiBladeModel, gen: torch.Generator) -> FittedModp:
        blocks = model.blocks
        codes = read_codes(source, domain)
        if len(codes) == 0:
            raise ConfigurationError("the source has no rows; MODP's empirical mode learns "
                                     "from rows")
        index = blocks.to_index(codes, device=gen.device)
        target = blocks.one_hot(index)
        model.start_from_marginals(target.mean(dim=0), scale=1.0)
        schedule = Schedule(warmup_epochs=self.warmup_epochs, epochs=self.epochs,
                            batch_size=self.batch_size, lr=self.lr or 0.01,
                            patience=self.patience)
        history = train_empirical(model, index, schedule, gen, progress)
        model.eval()
        truth = postprocess.crosstab(index, blocks)
        refine = Refinements(passthrough=self.passthrough)
        if self.structural_zeros:
            refine.impossible = postprocess.impossible_cells(truth, blocks)
        probs = _predict(model, index)
        first, bits = instantiate(probs, blocks, gen, self.passthrough, index)
        if self.two_instance:
            refine.weights = postprocess.overfill_weights(first, truth, blocks)
            losses = postprocess.pair_sums(first, refine.weights, blocks)
            refine.threshold = float(torch.quantile(losses.float(), 1 - self.two_instance))
        fitted = FittedModp(
            options=self, blocks=blocks, model=model, generator=gen,
            spent=PrivacyCost.zero(budget.kind), rows=len(codes), true_index=index,
            refinements=refine, training=history.as_dict())
        progress("modp: diagnostics", 0, 1)
        fitted.diagnostics = self._diagnostics(codes, first, bits, refine, rng, blocks)
        progress("modp: diagnostics", 1, 1)
        return fitted

    def _diagnostics(self, codes: np.ndarray, first: torch.Tensor, bits: torch.Tensor,
                     refine: Refinements, rng: np.random.Generator,
                     blocks: Blocks) -> dict[str, Any]:
        sample = rng.choice(len(codes), size=min(self.diagnostic_rows, len(codes)),
                            replace=False)
        out = diagnostics.report(codes, blocks.to_codes(first), bits.cpu().numpy(), sample)
        out["instance"] = "one draw per true row, before structural zeros and two-instance"
        if refine.impossible is not None:
            hit = postprocess.violates(first, refine.impossible, blocks)
            out["structural_zero_rows"] = round(float(hit.double().mean()), 4)
        if refine.weights is not None:
            switched = postprocess.pair_sums(first, refine.weights, blocks) > refine.threshold
            out["two_instance_switched"] = round(float(switched.double().mean()), 4)
            out["two_instance_threshold"] = round(refine.threshold, 6)
        return out

    # -- dp -------------------------------------------------------------------------------
    def _fit_dp(self, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
                rng: np.random.Generator, progress: Progress, model: MultiBladeModel,
                gen: torch.Generator) -> FittedModp:
        blocks = model.blocks
        seed_budget, _ = budget.split([self.seed_share, 1 - self.seed_share])
        progress("modp: seed marginals", 0, 1)
        seeds = DPSeeds.measure(source, domain, seed_budget, rng)
        progress("modp: seed marginals", 1, 1)
        model.start_from_marginals(torch.as_tensor(seeds.category_probabilities(),
                                                   device=gen.device), scale=0.0)
        index = blocks.to_index(read_codes(source, domain), device=gen.device)
        from dpsql.synth.modp.dpsgd import DPSGDConfig, train_dp  # dp-accounting: DP mode only

        config = DPSGDConfig(steps=self.steps, clip=self.clip,
                             sampling_rate=self.sampling_rate, lr=self.lr or 0.003)
        train_budget = budget - seeds.spent
        record = train_dp(model, index, config, train_budget, seeds.rows, domain.max_rows,
                          rng, progress)
        del index
        model.eval()
        spent = seeds.spent + record.pop("cost")
        # Wall times grow with the number of rows: keep them out of the provenance.
        timings = record.pop("seconds")
        if not budget.infinite and spent > budget:
            raise ConfigurationError("internal error: MODP spent more than its budget; this "
                                     "is a bug in dpsql")
        fitted = FittedModp(options=self, blocks=blocks, model=model, generator=gen,
                            spent=spent, rows=seeds.rows, seeds=seeds, dpsgd=record,
                            timings=timings)
        progress("modp: checks", 0, 1)
        fitted.checks = [seed_marginals_kept(fitted, max(self.diagnostic_rows, 1000), rng)]
        progress("modp: checks", 1, 1)
        return fitted

    def options(self) -> dict[str, Any]:
        """The options as a JSON-able dict."""
        return asdict(self)


def _predict(model: MultiBladeModel, index: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    with torch.no_grad(), devices.autocast(index.device):
        return torch.cat([model(rows).float() for rows in index.split(chunk)])


def read_codes(source: duckdb.DuckDBPyRelation, domain: Domain) -> np.ndarray:
    """The source's rows as domain codes (``rows x columns``, -1 outside the domain)."""
    relation = source.query("_dpsql_source", domain.encode_sql("_dpsql_source"))
    assert relation is not None  # a SELECT always gives a relation
    table = relation.fetchnumpy()
    columns = [np.ma.filled(np.ma.asarray(table[name]).astype(np.int64), -1)
               for name in domain.names]
    if not columns or len(columns[0]) == 0:
        return np.zeros((0, len(domain.names)), dtype=np.int64)
    return np.stack(columns, axis=1)
