"""SDS: DP aggregates and aggregate-seeded synthesis (Synthetic Data Showcase).

``fit`` releases noisy counts of every combination of up to R attribute values
(:mod:`.aggregates`); ``sample`` builds records from those counts alone
(:mod:`.synthesis`). The aggregates are a release product of their own
(``products()``: table ``released.<name>_aggregates``).

Privacy: under add/remove of one privacy unit (at most ``max_rows`` rows), the
record count, the per-length DP percentiles (report-noisy-max, discrete
Laplace, charged epsilon^2/2) and the k-tuple counts (discrete Gaussian, L2
sensitivity ``max_rows * sqrt(s_k)``) compose to at most the zCDP budget given
(derivation in :mod:`dpsql.synth.sds.aggregates`). Synthesis is post-processing.
Gaussian noise needs zCDP accounting: under a pure-DP policy ``fit`` refuses.
Method: Microsoft, Synthetic Data Showcase, "DP aggregates and synthesis".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError, ReleaseError
from dpsql.privacy import PrivacyCost, to_fraction
from dpsql.progress import Progress
from dpsql.synth.forecast import Forecast, Planned, baseline, expected_l1, noise_sd
from dpsql.synth.sds.aggregates import Aggregates, Level, Settings, aggregate, split_budget
from dpsql.synth.sds.synthesis import Options, Synthesizer
from dpsql.synth.sds.tuples import EMPTY, Items, TupleSpace, TupleTable

VERSION = "3"  # 2: default eta_1 = 1/(domain values); 3: pruning, paired pass, p_2 = 1/2


@dataclass(frozen=True)
class SDS:
    """Synthetic Data Showcase: DP k-tuple counts, then aggregate-seeded synthesis.

    Options (``--option name=value``):

    - ``reporting_length`` (3): longest attribute combination counted.
    - ``percentile`` (99): the percentile of the records' numbers of k-tuples that
      bounds each record's contribution (the rest is dropped at random).
    - ``percentile_epsilon_proportion`` (0.01): budget share of those percentiles.
    - ``number_of_records_epsilon_proportion`` (0.005): budget share of the noisy
      record count (unused when the policy makes the row count public).
    - ``sigma_proportions`` (1, 1/2, 1, ..., 1): relative noise per length; smaller means
      more budget for that length (rho_k ~ 1/p_k^2; pac-synth's default is 1, 1/2,
      ..., 1/R). Pairs get four times the share of the other lengths: the relaxed
      passes of synthesis, and the 2-way tables most analyses read, rest on them.
    - ``threshold_type`` (adaptive) and ``thresholds``: per length, ``fixed`` counts a
      tuple must exceed, or ``adaptive`` eta_k in (0, 1]: a combination absent from
      the data survives with probability about eta_k / 2. Adaptive defaults: eta_1 =
      1 / (number of domain values), so about half a value absent from the data
      survives in all; eta_k = 1 for longer combinations.
    - ``prune_uncovered`` (true): drop the released k-tuples (k >= 2) that no sub-tuple's
      count accounts for (see :func:`~dpsql.synth.sds.aggregates.prune_uncovered`).
    - ``paired_pass`` (true): finish the records the SDS loop leaves open from pair
      counts before 1-counts (see :mod:`dpsql.synth.sds.synthesis`).
    - ``use_synthetic_counts`` (true): weigh by what remains of each count after the
      records already synthesized.
    - ``weight_selection_percentile`` (95): beyond R attributes, the percentile of the
      counts of the candidate's sub-combinations used as its weight.
    """

    reporting_length: int = 3
    percentile: int = 99
    percentile_epsilon_proportion: float = 0.01
    number_of_records_epsilon_proportion: float = 0.005
    sigma_proportions: tuple[float, ...] | None = None
    threshold_type: str = "adaptive"
    thresholds: tuple[float, ...] | None = None
    prune_uncovered: bool = True
    paired_pass: bool = True
    use_synthetic_counts: bool = True
    weight_selection_percentile: int = 95

    name = "sds"  # class attributes, not options
    is_dp = True
    version = VERSION
    product_suffixes = ("aggregates",)  # released.<name>_aggregates (see FittedSDS.products)

    def __post_init__(self) -> None:
        r = self.reporting_length
        if not isinstance(r, int) or isinstance(r, bool) or r < 1:
            raise ConfigurationError(f"reporting_length must be an integer >= 1, got {r!r}")
        if not 1 <= self.percentile <= 100:
            raise ConfigurationError(f"percentile must be in [1, 100], got {self.percentile}")
        if not 0 <= self.weight_selection_percentile <= 100:
            raise ConfigurationError("weight_selection_percentile must be in [0, 100], got "
                                     f"{self.weight_selection_percentile}")
        q = to_fraction(self.percentile_epsilon_proportion, "percentile_epsilon_proportion")
        n = to_fraction(self.number_of_records_epsilon_proportion,
                        "number_of_records_epsilon_proportion")
        if not (0 < q < 1 and 0 < n < 1 and q + n < 1):
            raise ConfigurationError(
                "percentile_epsilon_proportion and number_of_records_epsilon_proportion must be "
                f"in (0, 1) with a sum below 1, got {self.percentile_epsilon_proportion} and "
                f"{self.number_of_records_epsilon_proportion}")
        if len(self.sigmas) != r or any(not p > 0 for p in self.sigmas):
            raise ConfigurationError(
                f"sigma_proportions needs {r} positive numbers (one per length up to "
                f"reporting_length), got {self.sigma_proportions}")
        if self.threshold_type not in ("fixed", "adaptive"):
            raise ConfigurationError(
                f"threshold_type must be 'fixed' or 'adaptive', got {self.threshold_type!r}")
        if self.thresholds is not None and len(self.thresholds) != r:
            raise ConfigurationError(
                f"thresholds needs {r} numbers (one per length), got {self.thresholds}")
        if self.threshold_type == "adaptive" and any(not 0 < e <= 1
                                                     for e in self.thresholds or ()):
            raise ConfigurationError(
                f"adaptive thresholds (eta) must be in (0, 1], got {self.thresholds}")

    @property
    def sigmas(self) -> tuple[float, ...]:
        """The sigma proportions in force (default 1/2 for pairs, 1 for the other lengths)."""
        if self.sigma_proportions is not None:
            return tuple(float(p) for p in self.sigma_proportions)
        return tuple(0.5 if k == 2 else 1.0 for k in range(1, self.reporting_length + 1))

    def levels(self, values: int) -> tuple[float, ...]:
        """The thresholds in force for a domain of ``values`` values (items).

        Fixed: 0 for every length. Adaptive: eta_1 = 1 / values, eta_k = 1 beyond.
        The 1-tuple candidates are every public domain value, present in the data
        or not, so eta_1 = 1 would let half of the absent ones through, and with
        them every combination synthesis builds on them; SDS avoids this with a
        delta-threshold on 1-counts, which dpsql does not need for privacy.
        Longer candidates extend released values only.
        """
        if self.thresholds is not None:
            return tuple(float(t) for t in self.thresholds)
        if self.threshold_type == "fixed":
            return (0.0,) * self.reporting_length
        return (min(1.0, 1 / max(values, 1)),) + (1.0,) * (self.reporting_length - 1)

    def parameters(self, values: int) -> dict[str, Any]:
        """Every option with its value in force for ``values`` domain values (provenance)."""
        return {
            "reporting_length": self.reporting_length,
            "percentile": self.percentile,
            "percentile_epsilon_proportion": self.percentile_epsilon_proportion,
            "number_of_records_epsilon_proportion": self.number_of_records_epsilon_proportion,
            "sigma_proportions": list(self.sigmas),
            "threshold_type": self.threshold_type,
            "thresholds": list(self.levels(values)),
            "prune_uncovered": self.prune_uncovered,
            "paired_pass": self.paired_pass,
            "use_synthetic_counts": self.use_synthetic_counts,
            "weight_selection_percentile": self.weight_selection_percentile,
        }

    def check(self, domain: Domain, budget: PrivacyCost) -> None:
        """Refuse what ``fit`` would refuse, before the release charges anything."""
        if budget.kind != "zcdp":
            raise ConfigurationError(
                "sds adds Gaussian noise, which is not pure DP; use a policy with "
                "accounting: zcdp (the budget is then charged as rho)")
        if budget.is_zero:
            raise ConfigurationError("sds needs a positive privacy budget")
        if self.reporting_length > len(domain):
            raise ConfigurationError(
                f"reporting_length {self.reporting_length} exceeds the {len(domain)} columns "
                "being synthesized; choose at most that many")

    def forecast(self, domain: Domain, budget: PrivacyCost) -> Forecast:
        """The k-tuple counts' noise, from the tuples a record may keep.

        The fit's sensitivity for length k is ``max_rows * sqrt(s_k)``, where
        ``s_k``, the k-tuples a record keeps, is a DP percentile chosen in the fit:
        every record has one 1-tuple per column (``s_1`` is the number of columns
        unless the percentile drops some), and at most ``C(columns, k)`` k-tuples.
        """
        settings = Settings(self.reporting_length, self.percentile,
                            to_fraction(self.percentile_epsilon_proportion),
                            to_fraction(self.number_of_records_epsilon_proportion),
                            self.sigmas, self.threshold_type, (), self.prune_uncovered)
        _, _, counts = split_budget(budget, settings, domain.public_rows is None)
        columns = len(domain.names)
        planned, notes = [], []
        oneway = None
        for k, part in enumerate(counts, start=1):
            unit, mechanism = noise_sd(part, domain.max_rows)  # for one tuple per record
            if k == 1:
                sd = unit * math.sqrt(columns)
                planned.append(Planned("1-tuple counts (every column's values)", 1,
                                       sum(domain.shape), mechanism, sd, at_most=True))
                oneway = sum(expected_l1(sd, mechanism, n) for n in domain.shape) / columns
            else:
                most = unit * math.sqrt(math.comb(columns, k))
                notes.append(f"{k}-tuple counts: {mechanism} noise sd {unit:.3g} to "
                             f"{most:.3g} per tuple (the square root of the {k}-tuples a "
                             "record keeps, a DP percentile chosen in the fit)")
        return Forecast(self.name, tuple(planned), domain.public_rows, baseline(domain, budget),
                        oneway=oneway, notes=tuple(notes))

    def fit(self, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
            rng: np.random.Generator, progress: Progress | None = None) -> FittedSDS:
        """Release the DP aggregates of ``source`` within ``budget`` (a zCDP cost)."""
        self.check(domain, budget)
        items = Items(domain)
        rows = items.from_codes(_encoded(source, domain))
        settings = Settings(self.reporting_length, self.percentile,
                            to_fraction(self.percentile_epsilon_proportion),
                            to_fraction(self.number_of_records_epsilon_proportion),
                            self.sigmas, self.threshold_type, self.levels(items.count),
                            self.prune_uncovered)
        seed = int(rng.integers(0, 2**63 - 1))
        result = aggregate(rows, items, settings, budget, domain.max_rows, domain.public_rows,
                           seed, progress)
        return FittedSDS(self, domain, items, result)

    def restore(self, state: dict[str, Any], domain: Domain) -> FittedSDS:
        """Rebuild a fitted model from :meth:`FittedSDS.state` (no new noise, no cost)."""
        try:
            items = Items(domain)
            if [int(s) for s in state["sizes"]] != items.sizes.tolist():
                raise ValueError("domain sizes changed")
            levels = []
            for saved in state["levels"]:
                k = int(saved["k"])
                rows = np.asarray(saved["tuples"], dtype=np.int64).reshape(-1, k)
                space = TupleSpace(items.sizes, k)
                table = TupleTable(space, space.item_keys(items, rows),
                                   np.asarray(saved["counts"], dtype=np.int64))
                levels.append(Level(k, rows[table.order], table))
            spent = state["spent"]
            cost = PrivacyCost(spent["kind"], int(spent["units"]), bool(spent["infinite"]))
            aggregates = Aggregates(levels, int(state["rows"]), cost, state["steps"],
                                    state["parts"])
        except (KeyError, ValueError, TypeError, IndexError, ConfigurationError) as err:
            raise ReleaseError("the stored state does not fit this release's domain (was the "
                               "policy's domain changed?); release again instead") from err
        config = self
        if str(state.get("version")) in ("1", "2"):  # its first copies had no paired pass
            config = replace(self, paired_pass=False)
        return FittedSDS(config, domain, items, aggregates)


def _encoded(source: duckdb.DuckDBPyRelation, domain: Domain) -> np.ndarray:
    """Fetch the source's domain codes (rows x columns, -1 where NULL), encoded by DuckDB."""
    sql = (f"WITH _bounded AS (SELECT * FROM _dpsql_source) "
           f"{domain.encode_sql('_bounded')}")
    relation = source.query("_dpsql_source", sql)
    assert relation is not None
    table = relation.to_arrow_table()
    out = np.empty((table.num_rows, table.num_columns), dtype=np.int64)
    for j in range(table.num_columns):
        column = pc.fill_null(table.column(j).cast(pa.int64()), EMPTY)
        out[:, j] = column.to_numpy()
    return out


@dataclass
class FittedSDS:
    """Released SDS aggregates and the sampler that reads them."""

    config: SDS
    domain: Domain
    items: Items
    aggregates: Aggregates
    spent: PrivacyCost = field(init=False)  # exact cost of the aggregates, <= the budget
    rows: int = field(init=False)  # the DP (or public) number of source records
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.spent = self.aggregates.spent
        self.rows = self.aggregates.rows

    def sample(self, n: int, rng: np.random.Generator,
               progress: Progress | None = None) -> pa.Table:
        """``n`` synthetic records as domain codes (post-processing of the aggregates)."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
            raise ConfigurationError(f"the number of rows must be an integer >= 0, got {n!r}")
        nullable = np.array([a.null_code is not None for a in self.domain.attributes])
        sampler = Synthesizer(self.items, self.aggregates.levels, nullable,
                              Options(self.config.use_synthetic_counts,
                                      self.config.weight_selection_percentile,
                                      self.config.paired_pass))
        rows, diagnostics = sampler.sample(int(n), self.rows, rng, progress)
        self.diagnostics = diagnostics
        out = {}
        for j, attribute in enumerate(self.domain.attributes):
            col = rows[:, j]
            codes = np.where(col == EMPTY, -1, self.items.code[np.maximum(col, 0)])
            if attribute.null_code is not None:
                codes = np.where(col == EMPTY, attribute.null_code, codes)
            out[attribute.name] = pa.array(codes.astype(np.int32))
        return pa.table(out)

    def state(self) -> dict[str, Any]:
        """The DP aggregates and what is needed to sample from them again (JSON-able)."""
        spent = self.aggregates.spent
        return {
            "version": VERSION,
            "rows": self.rows,
            "spent": {"kind": spent.kind, "units": str(spent.units), "infinite": spent.infinite},
            "sizes": self.items.sizes.tolist(),
            "levels": [{"k": level.k, "tuples": level.rows.ravel().tolist(),
                        "counts": level.table.values.astype(np.int64).tolist()}
                       for level in self.aggregates.levels],
            "steps": self.aggregates.steps,
            "parts": self.aggregates.parts,
        }

    def describe(self) -> dict[str, Any]:
        """Describe the fit: parameters in force, measurements, diagnostics (DP or public only).

        Measurements are the record count, then per length the candidates, the
        allowed sensitivity, the noise, the threshold, what was reported and each
        part's cost; diagnostics are warnings and the last sampling's counters.
        """
        agg = self.aggregates
        warnings = []
        if len(agg.levels) < self.config.reporting_length:
            warnings.append(
                f"only combinations of up to {len(agg.levels)} values were released (longer "
                "ones had no candidates or fell below their thresholds); synthesis uses those")
        return {
            "parameters": self.config.parameters(self.items.count),
            "measurements": [{"measure": "record_count", **agg.parts["record_count"]},
                             *({"measure": "k_tuples", **step} for step in agg.steps)],
            "diagnostics": {"warnings": warnings, "synthesis": dict(self.diagnostics)},
            "rows": agg.rows,
            "released_tuples": sum(len(level.rows) for level in agg.levels),
            "cost": agg.spent.as_dict(),
        }

    def products(self) -> dict[str, pa.Table]:
        """Return the DP aggregates: tuple (``column=label;...``), length, noisy count."""
        labels = [a.labels() for a in self.domain.attributes]
        names = self.domain.names
        texts: list[str] = []
        lengths: list[int] = []
        counts: list[int] = []
        for level in self.aggregates.levels:
            cols = self.items.column[level.rows]
            codes = self.items.code[level.rows]
            for c_row, v_row, count in zip(cols, codes, level.table.values, strict=True):
                texts.append(";".join(f"{names[c]}={labels[c][v]}"
                                      for c, v in zip(c_row, v_row, strict=True)))
                lengths.append(level.k)
                counts.append(int(count))
        table = pa.table({"tuple": pa.array(texts, pa.string()),
                          "length": pa.array(lengths, pa.int32()),
                          "noisy_count": pa.array(counts, pa.int64())})
        return {"aggregates": table}


__all__ = ["SDS", "FittedSDS"]
