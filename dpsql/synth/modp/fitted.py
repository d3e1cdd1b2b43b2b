"""A fitted MODP model and how it draws synthetic rows."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import torch

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError
from dpsql.privacy import PrivacyCost
from dpsql.synth.base import FittedSynthesizer, get
from dpsql.synth.modp import device as devices
from dpsql.synth.modp import postprocess
from dpsql.synth.modp.blocks import Blocks
from dpsql.synth.modp.instantiate import instantiate
from dpsql.synth.modp.model import MultiBladeModel
from dpsql.synth.modp.options import ModpOptions

RETRY_SAME_SOURCE = 10  # structural zeros: redraws from the same true row before another
MAX_ROUNDS = 500  # cheap: each round redraws only the rows still failing
NOT_DP = "statistics of the real rows: not differentially private (privacy: empirical)"


@dataclass
class DPSeeds:
    """The ``independent`` histogram synthesizer's fit: DP seed rows, marginals, row count."""

    histogram: FittedSynthesizer

    @classmethod
    def measure(cls, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
                rng: np.random.Generator) -> DPSeeds:
        """Fit ``independent`` (noisy 1-way marginals and row count) within ``budget``."""
        return cls(get("independent").fit(source, domain, budget, rng))

    @property
    def rows(self) -> int:
        """The DP row count."""
        return max(1, int(self.histogram.rows))

    @property
    def spent(self) -> PrivacyCost:
        """What the seed histogram spent."""
        return self.histogram.spent

    def category_probabilities(self) -> np.ndarray:
        """The post-processed marginals concatenated in block order (``width``)."""
        tables = self.histogram.tables  # type: ignore[attr-defined]
        return np.concatenate([np.asarray(t, dtype=np.float64).ravel() for t in tables])

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` seed rows (post-processing): the histogram's own sample, as codes."""
        table = self.histogram.sample(n, rng)
        return np.stack([table.column(c).to_numpy() for c in table.column_names], axis=1)

    def describe(self) -> dict[str, Any]:
        """The histogram's parameters, measurements and diagnostics (all DP)."""
        return self.histogram.describe()


@dataclass
class Refinements:
    """The empirical mode's optional post-processing (paper sec. 4.2-4.4)."""

    passthrough: float = 0.0
    impossible: torch.Tensor | None = None  # width x width, structural zeros
    weights: torch.Tensor | None = None  # width x width, two-instance overfill weights
    threshold: float = 0.5


@dataclass
class FittedModp:
    """A trained MODP model; ``sample`` draws rows, ``describe`` reports how it was made."""

    options: ModpOptions
    blocks: Blocks
    model: MultiBladeModel
    generator: torch.Generator
    spent: PrivacyCost
    rows: int
    true_index: torch.Tensor | None = field(default=None, repr=False)  # empirical only
    refinements: Refinements = field(default_factory=Refinements)
    training: dict[str, Any] = field(default_factory=dict)
    seeds: DPSeeds | None = None  # dp only
    dpsgd: dict[str, Any] = field(default_factory=dict)
    diagnostics: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)  # dp only: what a failure is
    timings: dict[str, float] = field(default_factory=dict)  # for benchmarks, never released

    @property
    def device(self) -> torch.device:
        """Where the model lives."""
        return self.generator.device

    def sample(self, n: int, rng: np.random.Generator) -> pa.Table:
        """``n`` synthetic rows as domain codes (int64, one column per attribute)."""
        if n < 0:
            raise ConfigurationError(f"cannot sample {n} rows; give a row count >= 0")
        gen = devices.generator(self.device, int(rng.integers(2**63)))
        if self.seeds is not None:
            index = self._dp_rows(n, rng, gen)
        else:
            index = self._empirical_rows(n, rng, gen)
        codes = self.blocks.to_codes(index)
        return pa.table({name: pa.array(codes[:, j], type=pa.int64())
                         for j, name in enumerate(self.blocks.names)})

    def _predict(self, index: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), devices.autocast(self.device):
            return torch.cat([self.model(rows).float() for rows in index.split(8192)]) \
                if len(index) else torch.zeros(0, self.blocks.width, device=self.device)

    def _dp_rows(self, n: int, rng: np.random.Generator, gen: torch.Generator) -> torch.Tensor:
        """Seed rows from the DP marginals, then ``passes`` minus-one resamplings."""
        assert self.seeds is not None
        index = self.blocks.to_index(self.seeds.sample(n, rng), device=self.device)
        for _ in range(self.options.passes):
            index, _ = instantiate(self._predict(index), self.blocks, gen)
        return index

    def _instance(self, true: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        refine = self.refinements
        probs = self._predict(true)
        first, _ = instantiate(probs, self.blocks, gen, refine.passthrough, true)
        if refine.weights is None:
            return first
        second, _ = instantiate(probs, self.blocks, gen, refine.passthrough, true)
        chosen, _ = postprocess.choose_instances(first, second, refine.weights,
                                                 refine.threshold, self.blocks)
        return chosen

    def _empirical_rows(self, n: int, rng: np.random.Generator,
                        gen: torch.Generator) -> torch.Tensor:
        """One synthetic row per chosen true row.

        With structural zeros, rows that fill an impossible cell are redrawn (from
        the same true row first, then from others).
        """
        assert self.true_index is not None
        population = len(self.true_index)
        sources = torch.as_tensor(postprocess.uniform_choice(rng, population, n),
                                  device=self.device)
        impossible = self.refinements.impossible
        done: list[torch.Tensor] = []
        for round_ in range(MAX_ROUNDS):
            rows = self._instance(self.true_index[sources], gen)
            if impossible is None:
                return rows
            bad = postprocess.violates(rows, impossible, self.blocks)
            done.append(rows[~bad])
            sources = sources[bad]
            if len(sources) == 0:
                return torch.cat(done)
            if round_ + 1 >= RETRY_SAME_SOURCE:
                sources = torch.as_tensor(rng.integers(population, size=len(sources)),
                                          device=self.device)
        raise ConfigurationError(  # no counts: they would describe the private rows
            f"structural_zeros: some rows still fill an impossible cell after {MAX_ROUNDS} "
            "draws; release without structural_zeros or train longer")

    def describe(self) -> dict[str, Any]:
        """Parameters, DP measurements and (empirical) diagnostics; no row data, no timings.

        In DP mode everything here is DP (the seed histogram's descriptors, the
        DP-SGD noise and cost); in empirical mode the diagnostics describe the
        real rows (their number, the training losses, the section-6 figures),
        which is what an empirical release must show, labelled as not DP.
        """
        parameters: dict[str, Any] = {
            "mode": self.options.mode, "options": asdict(self.options),
            "device": str(self.device),
            "model": {"blades": self.options.blades,
                      "reduced_features": self.options.reduced_features,
                      "categories": self.blocks.width, "columns": list(self.blocks.names),
                      "parameters": self.model.parameter_count()},
            "spent": self.spent.as_dict(),
        }
        if self.seeds is None:
            return {"parameters": parameters, "measurements": [],
                    "diagnostics": {"not_dp": NOT_DP, "rows": self.rows,
                                    "training": self.training, **self.diagnostics}}
        parameters["rows"] = self.rows  # the seed histogram's DP estimate
        seeds = self.seeds.describe()
        parameters["seeds"] = {"synthesizer": "independent", "spent": self.seeds.spent.as_dict(),
                               "rows": self.seeds.rows, **seeds.get("parameters", {})}
        parameters["dpsgd"] = self.dpsgd
        return {"parameters": parameters, "measurements": seeds.get("measurements", []),
                "diagnostics": {"seeds": seeds.get("diagnostics", {}), "checks": self.checks}}
