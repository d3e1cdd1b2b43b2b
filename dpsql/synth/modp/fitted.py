"""A fitted MODP model and how it draws synthetic rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
import torch

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError
from dpsql.privacy import PrivacyCost
from dpsql.synth.measure import Measurement
from dpsql.synth.modp import device as devices
from dpsql.synth.modp import postprocess
from dpsql.synth.modp.blocks import Blocks
from dpsql.synth.modp.instantiate import instantiate
from dpsql.synth.modp.model import MultiBladeModel

if TYPE_CHECKING:
    from dpsql.synth.modp.synthesizer import Modp

RETRY_SAME_SOURCE = 10  # structural zeros: redraws from the same true row before another
MAX_ROUNDS = 500  # cheap: each round redraws only the rows still failing


@dataclass
class DPSeeds:
    """Noisy one-way marginals (the ``independent`` histogram): DP seeds and row count."""

    measurements: list[Measurement]
    probabilities: list[np.ndarray]
    rows: int
    spent: PrivacyCost

    @classmethod
    def measure(cls, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
                measure: Callable[..., list[Measurement]]) -> DPSeeds:
        """Measure every column's marginal within ``budget`` (see ``measure_marginals``)."""
        found = measure(source, domain, [[name] for name in domain.names], budget)
        probabilities = []
        for m in found:
            counts = np.clip(np.asarray(m.noisy, dtype=np.float64), 0, None)
            total = counts.sum()
            probabilities.append(counts / total if total > 0
                                 else np.full(counts.size, 1 / counts.size))
        # each marginal's total estimates the row count, with noise variance cells * var
        weights = np.array([1 / (m.noisy.size * max(m.variance, 1e-300)) for m in found])
        totals = np.array([float(np.sum(m.noisy)) for m in found])
        rows = int(max(1, round(float(weights @ totals / weights.sum())))) if found else 1
        spent = PrivacyCost.zero(budget.kind)
        for m in found:
            spent = spent + m.cost
        return cls(found, probabilities, rows, spent)

    def category_probabilities(self) -> np.ndarray:
        """The marginals concatenated in block order (``width``)."""
        return np.concatenate(self.probabilities)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` seed rows, every column independent (post-processing)."""
        return np.stack([rng.choice(len(p), size=n, p=p) for p in self.probabilities], axis=1)


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

    options: Modp
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
        """JSON-able parameters, DP measurements and (empirical) diagnostics; no row data."""
        options = asdict(self.options)
        out: dict[str, Any] = {
            "synthesizer": "modp", "mode": self.options.mode,
            "privacy": "dp" if self.options.is_dp else "empirical",
            "options": options, "device": str(self.device),
            "model": {"blades": self.options.blades,
                      "reduced_features": self.options.reduced_features,
                      "categories": self.blocks.width, "columns": list(self.blocks.names),
                      "parameters": self.model.parameter_count()},
            "spent": self.spent.as_dict(), "rows": self.rows,
        }
        if self.seeds is not None:
            out["measurements"] = [m.describe() for m in self.seeds.measurements]
            out["seed_cost"] = self.seeds.spent.as_dict()
            out["dpsgd"] = self.dpsgd
        else:
            out["training"] = self.training
            out["diagnostics"] = self.diagnostics
        return out


def columns_of(table: pa.Table, names: Sequence[str]) -> np.ndarray:
    """A code table's columns as a ``rows x columns`` int64 array."""
    return np.stack([table.column(n).to_numpy() for n in names], axis=1)
