"""Crosstab fidelity of synthetic data against the real data (not DP: admins only).

Every cell of every 1-way and 2-way crosstab (over the release's domain codes)
is scored as in Rodriguez & Press, "MODP" (sec. 5):

- log discrepancy ``d = |log((C_syn + c) / (C_true + c))|`` with c = 1 (eq. 11);
- the two-proportion z statistic of the cell's share in each table (eq. 10);
- the blended figure of merit ``2 / (d0/|d| + z0/|z|)``, d0 = 0.1, z0 = 1 (eq. 12);

summarised by median, mean and r.m.s.; plus private-pgm's workload error (the
mean over all 2-way marginals of half the L1 distance between the normalised
tables). A bootstrap resample of the real data scored the same way gives the
"ideal" a perfect synthesizer could hope for (the paper's Figure 1).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np

from dpsql.domain import Domain, quote

if TYPE_CHECKING:
    from dpsql.context import Context

PSEUDOCOUNT = 1.0
D0 = 0.1
Z0 = 1.0

Marginal = tuple[int, ...]


def crosstabs(codes: np.ndarray, sizes: Sequence[int]) -> dict[Marginal, np.ndarray]:
    """Counts of every 1-way and 2-way marginal of a code matrix (rows x columns).

    A code of -1 (outside the public domain) counts in no cell of its marginals.
    """
    codes = np.asarray(codes, dtype=np.int64).reshape(-1, len(sizes))
    out: dict[Marginal, np.ndarray] = {}
    for i, size in enumerate(sizes):
        column = codes[:, i]
        out[(i,)] = np.bincount(column[column >= 0], minlength=size)
    for i, j in itertools.combinations(range(len(sizes)), 2):
        a, b = codes[:, i], codes[:, j]
        valid = (a >= 0) & (b >= 0)
        flat = a[valid] * sizes[j] + b[valid]
        out[(i, j)] = np.bincount(flat, minlength=sizes[i] * sizes[j]).reshape(sizes[i],
                                                                               sizes[j])
    return out


def log_discrepancy(synthetic: np.ndarray, true: np.ndarray,
                    pseudocount: float = PSEUDOCOUNT) -> np.ndarray:
    """``|log((C_syn + c) / (C_true + c))|`` per cell (MODP eq. 11)."""
    return np.abs(np.log((synthetic + pseudocount) / (true + pseudocount)))


def z_statistic(n_true: np.ndarray, total_true: float, n_syn: np.ndarray,
                total_syn: float) -> np.ndarray:
    """Two-proportion z of each cell's share in the true and synthetic tables (MODP eq. 10).

    0 where the pooled share is 0 or 1 (both tables agree exactly).
    """
    p1 = n_true / total_true if total_true else np.zeros_like(n_true, dtype=float)
    p2 = n_syn / total_syn if total_syn else np.zeros_like(n_syn, dtype=float)
    pooled = (n_true + n_syn) / max(total_true + total_syn, 1)
    inverse = (1 / total_true if total_true else 0.0) + (1 / total_syn if total_syn else 0.0)
    variance = pooled * (1 - pooled) * inverse
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(variance > 0, (p1 - p2) / np.sqrt(np.where(variance > 0, variance, 1)), 0.0)
    return np.asarray(z, dtype=float)


def figure_of_merit(d: np.ndarray, z: np.ndarray, d0: float = D0, z0: float = Z0) -> np.ndarray:
    """``2 / (d0/|d| + z0/|z|)`` per cell (MODP eq. 12); 0 where either is 0."""
    d, z = np.abs(d), np.abs(z)
    with np.errstate(divide="ignore"):
        out = np.where((d > 0) & (z > 0),
                       2 / (d0 / np.where(d > 0, d, 1) + z0 / np.where(z > 0, z, 1)), 0.0)
    return np.asarray(out, dtype=float)


def workload_error(true: dict[Marginal, np.ndarray], synthetic: dict[Marginal, np.ndarray]
                   ) -> float:
    """Private-pgm's workload error: mean half-L1 distance of normalised 2-way tables.

    Over 1-way tables when there is a single column.
    """
    keys: list[Marginal] = [k for k in true if len(k) == 2] or list(true)
    errors = []
    for key in keys:
        t, s = true[key].astype(float), synthetic[key].astype(float)
        t = t / t.sum() if t.sum() else t
        s = s / s.sum() if s.sum() else s
        errors.append(0.5 * np.abs(t - s).sum())
    return float(np.mean(errors))


def _summary(values: np.ndarray) -> tuple[float, float, float]:
    if values.size == 0:
        return (math.nan, math.nan, math.nan)
    return (float(np.median(values)), float(np.mean(values)),
            float(np.sqrt(np.mean(values**2))))


@dataclass(frozen=True)
class Fidelity:
    """Per-cell scores of one synthetic (or resampled) table against the true one."""

    true: np.ndarray       # true count of every crosstab cell, 1-way cells first
    synthetic: np.ndarray  # synthetic count of the same cells
    order: np.ndarray      # 1 or 2: the crosstab each cell belongs to
    d: np.ndarray
    z: np.ndarray
    fm: np.ndarray
    workload_error: float
    rows_true: int
    rows_synthetic: int

    def summary(self) -> dict[str, float]:
        """Median, mean and r.m.s. of d, |z| and the figure of merit, and the workload error."""
        out: dict[str, float] = {}
        for label, values in (("d", self.d), ("z", np.abs(self.z)), ("fm", self.fm)):
            median, mean, rms = _summary(values)
            out.update({f"median_{label}": median, f"mean_{label}": mean, f"rms_{label}": rms})
        out["workload_error"] = self.workload_error
        out["cells"] = float(self.d.size)
        return out


def compare(true: dict[Marginal, np.ndarray], synthetic: dict[Marginal, np.ndarray]
            ) -> Fidelity:
    """Score ``synthetic`` crosstabs against ``true`` ones (same keys and shapes)."""
    keys = sorted(true, key=lambda k: (len(k), k))
    t_cells, s_cells, orders, zs = [], [], [], []
    for key in keys:
        t, s = true[key].ravel().astype(float), synthetic[key].ravel().astype(float)
        t_cells.append(t)
        s_cells.append(s)
        orders.append(np.full(t.size, len(key)))
        zs.append(z_statistic(t, t.sum(), s, s.sum()))
    t_all, s_all, z_all = np.concatenate(t_cells), np.concatenate(s_cells), np.concatenate(zs)
    d_all = log_discrepancy(s_all, t_all)
    rows_true = int(true[keys[0]].sum()) if keys else 0
    rows_syn = int(synthetic[keys[0]].sum()) if keys else 0
    return Fidelity(t_all, s_all, np.concatenate(orders), d_all, z_all,
                    figure_of_merit(d_all, z_all), workload_error(true, synthetic), rows_true,
                    rows_syn)


def score(true_codes: np.ndarray, synthetic_codes: np.ndarray, sizes: Sequence[int]
          ) -> Fidelity:
    """Score a synthetic code matrix against the true one."""
    return compare(crosstabs(true_codes, sizes), crosstabs(synthetic_codes, sizes))


def bootstrap_ideal(true_codes: np.ndarray, sizes: Sequence[int], rng: np.random.Generator,
                    rows: int | None = None) -> Fidelity:
    """The scores of a resample (with replacement) of the true rows: what sampling alone costs."""
    n = len(true_codes)
    resample = true_codes[rng.integers(0, n, size=rows or n)]
    return score(true_codes, resample, sizes)


def fetch_codes(cursor: duckdb.DuckDBPyConnection, select_sql: str, names: Sequence[str]
                ) -> np.ndarray:
    """Run an encoding SELECT and return its codes as a (rows x columns) int matrix (-1: NULL)."""
    result = cursor.execute(select_sql).fetchnumpy()
    if not names:
        return np.zeros((0, 0), dtype=np.int64)
    columns = [np.ma.filled(np.ma.asarray(result[n]).astype(np.float64), -1) for n in names]
    return np.stack(columns, axis=1).astype(np.int64)


@dataclass(frozen=True)
class Evaluation:
    """A release scored against the real data, next to the bootstrap ideal (not DP)."""

    name: str
    record: dict[str, Any]
    domain: Domain
    copy: int | None
    synthetic: Fidelity
    ideal: Fidelity
    true_tables: dict[Marginal, np.ndarray]
    synthetic_tables: dict[Marginal, np.ndarray]

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary (what ``dpsql evaluate --json`` prints)."""
        return {"name": self.name, "copy": self.copy, "dp": False,
                "note": "computed from the real data: not differentially private",
                "rows_true": self.synthetic.rows_true,
                "rows_synthetic": self.synthetic.rows_synthetic,
                "synthetic": self.synthetic.summary(), "ideal": self.ideal.summary()}


def evaluate_release(ctx: Context, name: str, *, copy: int | None = None,
                     seed: int = 0) -> Evaluation:
    """Score release ``name`` (one copy) against the bounded real data (admins only; audited).

    ``ctx``: the request's (``session.context()``): its user, and the policy in force.
    """
    from dpsql import provenance
    from dpsql.engines.source import bounded_sql
    from dpsql.errors import ReleaseError
    from dpsql.imports import table_columns
    from dpsql.outcomes import Outcome
    from dpsql.policies import release_dataset, release_domain
    from dpsql.release.fit import COPY_COLUMN
    from dpsql.store import check_identifier

    ctx.require_admin("evaluate a release against the real data")
    store = ctx.store
    entry = provenance.find(store, name)
    record = entry["record"]
    if record.get("output") != "rows":
        raise ReleaseError(f"release {name!r} is a table of counts, not rows; query it with "
                           "udfs.dp_range_count instead")
    domain = release_domain(store, record)
    dataset = release_dataset(store, record)
    if dataset.engine is not None:
        raise ReleaseError(f"dataset {dataset.name!r} lives on another engine, and evaluate "
                           "reads the real rows from the store only for now (docs/engines.md)")
    copies = int(record.get("copies", 1))
    schema = record["table"].partition(".")[0]  # released, or held while unpublished
    has_copy_column = COPY_COLUMN in table_columns(store, name, schema)
    chosen = copy if copy is not None else (1 if has_copy_column else None)
    if chosen is not None and not 1 <= chosen <= copies:
        raise ReleaseError(f"release {name!r} has copies 1 to {copies}; got --copy {chosen}")
    table = f"{schema}.{quote(check_identifier(name, 'release name'))}"
    where = f" WHERE {COPY_COLUMN} = {int(chosen)}" if has_copy_column and chosen else ""
    # Audited before the real rows are read, so even a crash leaves a trace; the outcome
    # says whether the evaluation finished.
    ledger = ctx.ledger
    audit_id = ledger.record(ctx.user, dataset.name, f"evaluate {name}", Outcome.STARTED,
                             "not DP: fidelity computed from the real data", action="evaluate")
    try:
        cursor = store.cursor()
        names = list(domain.names)
        synthetic = fetch_codes(cursor, domain.encode_decoded_sql(
            f"(SELECT * FROM {table}{where})"), names)
        true = fetch_codes(cursor, domain.encode_sql(bounded_sql(dataset, store.secret)), names)
        sizes = list(domain.shape)
        true_tables, synthetic_tables = crosstabs(true, sizes), crosstabs(synthetic, sizes)
        result = Evaluation(name, record, domain, chosen, compare(true_tables, synthetic_tables),
                            bootstrap_ideal(true, sizes, np.random.default_rng(seed)),
                            true_tables, synthetic_tables)
    except BaseException as err:
        ledger.settle(audit_id, Outcome.FAILED,
                      f"not DP: the evaluation failed ({type(err).__name__})")
        raise
    ledger.settle(audit_id, Outcome.EVALUATED)
    return result
